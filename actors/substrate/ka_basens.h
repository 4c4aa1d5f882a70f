/*
 * ka_basens: the mount namespace a sandbox's own is copied from.
 *
 * A new mount namespace is a copy of its creator's: every mount in it is duplicated, then, once
 * the sandbox has pivoted into its root, detached again, all under the kernel's global
 * namespace lock. The node's namespace holds one mount per live sandbox (its volume), so each
 * start used to copy and drop them all: measured here with `unshare -m true`, +2.9 ms at 1,000
 * mounts, +15 ms at 5,000, +39 ms at 10,000, serialising every start. The node now keeps a
 * private copy of its namespace taken at start with every volume detached from it; kagent-spawn
 * enters it before it unshares (a copy of a few mounts) and attaches the one volume the sandbox
 * needs as a detached clone of its mount (open_tree, then move_mount to the same path).
 */
#ifndef KA_BASENS_H
#define KA_BASENS_H

/* A descriptor (close-on-exec) of a new mount namespace: a private copy of the caller's with
 * every mount under volume_dir detached. -errno if it cannot be made (then sandboxes copy
 * the node's namespace, as before). */
int ka_basens_open(const char *volume_dir);

/* The number of mounts under dir in the namespace of descriptor ns (tests), or -errno. */
int ka_basens_count(int ns, const char *dir);

#endif
