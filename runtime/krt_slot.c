/*
 * Address slots: index + generation, the sender pin count, allocation, retirement (see the
 * memory model in krt_int.h).
 */
#include "krt_int.h"

#include <sched.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------- */
/* Slots                                                                                      */

static krt_slot_t *s_slot_make(krt_system_t *sys, uint32_t idx)
{
    krt_slot_t *slot = krt__slot(sys, idx);
    if (slot)
        return slot;
    krt_slot_t *c = calloc(KRT_CHUNK_SIZE, sizeof *c), *expect = NULL;
    if (!c)
        return NULL;
    if (!atomic_compare_exchange_strong(&sys->chunks[idx >> KRT_CHUNK_BITS], &expect, c))
        free(c);
    return krt__slot(sys, idx);
}

int krt__slot_alloc(krt_system_t *sys, krt_sched_t *s, uint32_t *out)
{
    uint32_t idx = 0;
    if (s && s->n_free_slots) {
        idx = s->free_slots[--s->n_free_slots];
    } else {
        pthread_mutex_lock(&sys->slot_lock);
        if (sys->n_gfree)
            idx = sys->gfree[--sys->n_gfree];
        pthread_mutex_unlock(&sys->slot_lock);
    }
    if (!idx) {
        if (s) {
            if (s->fresh_next == s->fresh_end) {
                s->fresh_next = atomic_fetch_add(&sys->next_slot, 64);
                s->fresh_end = s->fresh_next + 64;
            }
            idx = s->fresh_next++;
        } else {
            idx = atomic_fetch_add(&sys->next_slot, 1);
        }
        if (idx > KRT_SLOT_MASK)
            return KRT_ENOMEM;
    }
    if (!s_slot_make(sys, idx))
        return KRT_ENOMEM;
    *out = idx;
    return 0;
}

static void s_push_idx(uint32_t **arr, uint32_t *n, uint32_t *cap, uint32_t idx)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 256;
        uint32_t *na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return; /* the slot is lost, never reused: harmless */
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = idx;
}

/* Returns the slot to a free list with its generation bumped (retired when exhausted). */
void krt__slot_free(krt_system_t *sys, krt_sched_t *s, uint32_t idx)
{
    krt_slot_t *slot = krt__slot(sys, idx);
    uint64_t gen = (atomic_load(&slot->word) >> 32) + 1;
    atomic_store_explicit(&slot->actor, NULL, memory_order_relaxed);
    atomic_store_explicit(&slot->word, gen << 32, memory_order_release);
    if (gen > KRT_GEN_MAX)
        return;
    if (s) {
        s_push_idx(&s->free_slots, &s->n_free_slots, &s->cap_free_slots, idx);
    } else {
        pthread_mutex_lock(&sys->slot_lock);
        s_push_idx(&sys->gfree, &sys->n_gfree, &sys->cap_gfree, idx);
        pthread_mutex_unlock(&sys->slot_lock);
    }
}

/* Marks the actor dead and waits until no sender holds it. */
void krt__slot_kill(krt_system_t *sys, krt_actor_t *a)
{
    krt_slot_t *slot = krt__slot(sys, (uint32_t)(a->addr & KRT_SLOT_MASK));
    atomic_fetch_and(&slot->word, ~KRT_SLOT_ALIVE);
    for (int spins = 0; atomic_load_explicit(&slot->word, memory_order_acquire) & KRT_SLOT_REFS;
         spins++) {
        if (spins < 100)
            krt__relax();
        else
            sched_yield();
    }
}
