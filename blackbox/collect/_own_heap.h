/* The sampler thread's own heap (included by _csample.c): where an address-space limit is set (RLIMIT_AS,
 * `ulimit -v`), the recorder's sampler thread allocates from a small region of its own, never from glibc.
 *
 * Why: glibc gives each thread that first calls malloc an arena of its own, and an arena reserves 64 MiB of
 * address space (HEAP_MAX_SIZE) however little it holds. Unlimited, that reservation costs nothing; under
 * `ulimit -v` it is 64 MiB the job loses: its MemoryError came 4 steps of 16 MiB earlier armed than unarmed.
 * Nothing public lets a thread use an arena that is already there: thread_arena is libc-private TLS,
 * M_ARENA_MAX binds the job's later threads too (glibc keeps the limit it computes), an arena that fails to
 * be made is tried again at every malloc, and a thread that only frees still makes one (free sets up the
 * thread's tcache, from its arena). So the sampler thread must never enter glibc's malloc or free at all.
 *
 * How: the hooks (GOT slots, _csample.c) see every allocation the sampler thread makes through Python. On
 * the thread that claimed this heap (own_claim, the first thing the sampler thread runs), the hooks in the
 * malloc, calloc and realloc slots of libpython, numpy's core and the ring writer (own_serves) serve it here:
 * blocks of 32 B to OWN_MAX_BLOCK in power-of-two classes, cut from the region and kept on a free list per
 * class, never coalesced; a larger block is a mapping of its own (one of OWN_BIGS). Only those, because what
 * they allocate they free through their own hooked free, or libpython's (slots disarm leaves hooked once a
 * block was handed out); a block another library got
 * here could go back through a free that was never hooked (libc's own, inside getline; an object loaded since
 * the last scan), and glibc aborts on a block that is not its own. Every hooked free and realloc takes back a
 * block of this heap, from any thread: another thread's goes on an atomic list the owner reclaims at its next
 * malloc. A glibc block the owner frees (the job's object, dropped by the sampler, or collected by a GC the
 * sampler ran) goes on a second atomic list, handed to glibc's free by the next other thread that enters a
 * hook, or by disarm. No lock, no wait: each list is a push with compare-and-swap and a take-all exchange.
 * What this heap cannot serve (the region used up, a larger block's table full, another library's
 * allocation on the sampler thread) goes to glibc as before: the arena is made then, as it is without this
 * heap, and own.fallbacks counts the first two.
 *
 * A block's 16-byte header reads as glibc's for a mapped chunk (size | IS_MMAPPED), so malloc_usable_size
 * answers right for one. The region is mapped once and never unmapped. In a forked child the lists are as the
 * fork left them (each change is one store, a head stored last), the owner is none, and a child that arms
 * claims it. What still reaches glibc from the sampler thread is libc's own internal allocations (opendir: the
 * tick lists /proc/self/task through list_dir instead) and those of other libraries that a collector may
 * call; tools/bench_address_space.py measures what arming takes. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define OWN_HEADER 16
#define OWN_MIN_SHIFT 5  /* 32-byte blocks, header included */
#define OWN_CLASSES 12   /* to 64 KiB; a larger block is a mapping of its own, one of OWN_BIGS */
#define OWN_BIGS 64
#define OWN_MAX_BLOCK ((size_t)1 << (OWN_MIN_SHIFT + OWN_CLASSES - 1))
#define OWN_MAPPED_BIT 2 /* glibc's IS_MMAPPED */

typedef struct OwnFree {
    struct OwnFree *next;
} OwnFree;

static struct {
    char *base;         /* the region: set once, never unmapped */
    size_t size;        /* 0: no own heap (the hooks test this first) */
    size_t cut;         /* bytes of the region cut into blocks (owner only) */
    int owner;          /* atomic: a thread serves from it (that thread's tls.own is 1) */
    int expect;         /* atomic: the sampler is starting and will claim it */
    OwnFree *free[OWN_CLASSES]; /* owner only */
    OwnFree *remote;    /* atomic: our blocks freed by other threads */
    OwnFree *deferred;  /* atomic: glibc's blocks freed by the owner, for another thread to free */
    uintptr_t big[OWN_BIGS]; /* atomic: the larger blocks' mappings (0: a free entry); set by the owner */
    int bigs;                /* atomic: how many are set */
    uint64_t in_use, high, fallbacks, deferred_frees; /* counters (in_use, high: the owner's, bytes) */
    uint64_t big_in_use; /* atomic: bytes in larger blocks */
    uint64_t bigs_made;  /* larger blocks mapped (owner) */
} own;

/* A larger block's payload starts 16 bytes into a page, as glibc's mapped chunks do, and a chunk of its arenas
 * does one time in 256: only those are looked for in the table, and only while it holds one. */
static int own_big(const void *p) {
    if (((uintptr_t)p & 4095) != OWN_HEADER || __atomic_load_n(&own.bigs, __ATOMIC_ACQUIRE) == 0)
        return -1;
    for (int i = 0; i < OWN_BIGS; i++)
        if (__atomic_load_n(&own.big[i], __ATOMIC_ACQUIRE) == (uintptr_t)p - OWN_HEADER)
            return i;
    return -1;
}

static inline int own_has(const void *p) {
    return (uintptr_t)p - (uintptr_t)own.base < own.size || own_big(p) >= 0;
}

static inline size_t own_block(const void *p) { return (size_t)(((const uint64_t *)p)[-1] & ~(uint64_t)7); }

static inline int own_class(size_t need) {
    int c = 0;
    while (c < OWN_CLASSES && ((size_t)1 << (OWN_MIN_SHIFT + c)) < need)
        c++;
    return c < OWN_CLASSES ? c : -1;
}

static void own_push(OwnFree **list, void *p) {
    OwnFree *b = p, *head = __atomic_load_n(list, __ATOMIC_RELAXED);
    do
        b->next = head;
    while (!__atomic_compare_exchange_n(list, &head, b, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
}

/* The owner takes back the blocks other threads freed. */
static void own_reclaim(void) {
    OwnFree *b = __atomic_exchange_n(&own.remote, NULL, __ATOMIC_ACQUIRE);
    while (b != NULL) {
        OwnFree *next = b->next;
        size_t block = own_block(b);
        int c = own_class(block);
        b->next = own.free[c];
        __atomic_store_n(&own.free[c], b, __ATOMIC_RELEASE); /* a fork's snapshot sees b's next with b */
        own.in_use -= block;
        b = next;
    }
}

/* A larger block: a mapping of its own, as glibc makes one past its mmap threshold (128 KiB); zeros. Owner
 * only. */
static void *own_big_malloc(size_t n) {
    size_t len = (n + OWN_HEADER + 4095) & ~(size_t)4095;
    if (len < n)
        return NULL;
    for (int i = 0; i < OWN_BIGS; i++) {
        if (__atomic_load_n(&own.big[i], __ATOMIC_RELAXED) != 0)
            continue;
        char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b == MAP_FAILED)
            return NULL;
        ((uint64_t *)b)[0] = 0;
        ((uint64_t *)b)[1] = len | OWN_MAPPED_BIT;
        __atomic_store_n(&own.big[i], (uintptr_t)b, __ATOMIC_RELEASE); /* only the owner sets an entry */
        __atomic_add_fetch(&own.bigs, 1, __ATOMIC_RELEASE);
        own.bigs_made++;
        uint64_t now = own.in_use + __atomic_add_fetch(&own.big_in_use, len, __ATOMIC_RELAXED);
        if (now > own.high)
            own.high = now;
        return b + OWN_HEADER;
    }
    return NULL;
}

/* A block of the heap for n bytes, or NULL (the caller goes to glibc); fresh: never used, so zeros (calloc
 * leaves it be, as glibc leaves a fresh mapping). Owner only. */
static void *own_malloc(size_t n, int *fresh) {
    *fresh = 1;
    if (n > OWN_MAX_BLOCK - OWN_HEADER) {
        void *p = own_big_malloc(n);
        if (p == NULL)
            own.fallbacks++;
        return p;
    }
    int c = own_class(n + OWN_HEADER);
    size_t block = (size_t)1 << (OWN_MIN_SHIFT + c);
    if (own.free[c] == NULL && __atomic_load_n(&own.remote, __ATOMIC_RELAXED) != NULL)
        own_reclaim();
    char *b = (char *)own.free[c];
    if (b != NULL) {
        own.free[c] = own.free[c]->next;
        b -= OWN_HEADER;
        *fresh = 0;
    } else if (own.size - own.cut >= block) {
        b = own.base + own.cut;
        own.cut += block;
    } else {
        own.fallbacks++;
        return NULL;
    }
    ((uint64_t *)b)[0] = 0;
    ((uint64_t *)b)[1] = block | OWN_MAPPED_BIT;
    own.in_use += block;
    uint64_t now = own.in_use + __atomic_load_n(&own.big_in_use, __ATOMIC_RELAXED);
    if (now > own.high)
        own.high = now;
    return b + OWN_HEADER;
}

static inline int own_is_owner(void) { return tls.own == 1; }

/* Free a block of the heap, from any thread. */
static void own_free(void *p) {
    int i = own_big(p);
    if (i >= 0) { /* whoever clears the entry unmaps it */
        uintptr_t b = (uintptr_t)p - OWN_HEADER;
        if (__atomic_compare_exchange_n(&own.big[i], &b, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            size_t len = own_block(p);
            __atomic_sub_fetch(&own.bigs, 1, __ATOMIC_RELEASE);
            __atomic_sub_fetch(&own.big_in_use, len, __ATOMIC_RELAXED);
            munmap((char *)b, len);
        }
        return;
    }
    if (own_is_owner()) {
        int c = own_class(own_block(p));
        OwnFree *b = p;
        b->next = own.free[c];
        __atomic_store_n(&own.free[c], b, __ATOMIC_RELEASE);
        own.in_use -= own_block(p);
    } else {
        own_push(&own.remote, p);
    }
}

/* glibc's free for the blocks the owner let go (any thread but the owner: glibc would make it an arena). */
static void own_drain(void (*real_free)(void *)) {
    OwnFree *b = __atomic_exchange_n(&own.deferred, NULL, __ATOMIC_ACQUIRE);
    while (b != NULL) {
        OwnFree *next = b->next;
        real_free(b);
        b = next;
    }
}

/* The bytes a block of either heap can hold: ours from its header, glibc's from glibc. */
static size_t own_usable(const void *p, size_t (*real_usable)(void *)) {
    if (own_has(p))
        return own_block(p) - OWN_HEADER;
    return real_usable != NULL ? real_usable((void *)p) : 0;
}

/* Map the region (once; a later call with the region there only says so). */
static int own_start(size_t bytes) {
    if (own.size != 0)
        return 1;
    bytes = (bytes + 4095) & ~(size_t)4095;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    own.base = p;
    __atomic_store_n(&own.size, bytes, __ATOMIC_RELEASE);
    return 1;
}

static int own_claim(void) {
    int none = 0;
    if (own.size == 0 || tls.own != 0 ||
        !__atomic_compare_exchange_n(&own.owner, &none, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return 0;
    tls.own = 1;
    __atomic_store_n(&own.expect, 0, __ATOMIC_RELEASE);
    return 1;
}

/* The owner lets go (the sampler, as it ends): its frees of glibc's blocks still wait for another thread. */
static void own_release(void) {
    if (tls.own != 1)
        return;
    tls.own = 2;
    __atomic_store_n(&own.owner, 0, __ATOMIC_RELEASE);
}
