/* kagent-spawn's executable, linked into the node as bytes (ka_spawn.h): the node writes it out
 * at start, so a node is one file to install and never execs a helper another build left. */
    .section .rodata
    .balign 64
    .globl ka_spawn_image
ka_spawn_image:
    .incbin KA_SPAWN_BIN
    .globl ka_spawn_image_end
ka_spawn_image_end:
    .byte 0
    .section .note.GNU-stack, "", @progbits
