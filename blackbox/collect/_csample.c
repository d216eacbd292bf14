/* blackbox.collect._csample: allocations sampled by bytes, in C (optional; collect/allocs.py drives it).
 *
 * Why this mechanism (the choice the issue asks to explain): torch CPU tensors, the commonest host
 * leak, get their storage from c10's CPU allocator (posix_memalign/free called from libc10.so), not
 * from PyMem or numpy's handler. Only native interposition reaches them. LD_PRELOAD works only when
 * blackbox starts the process (`blackbox run`), not under `arm()` in a running job, and it changes
 * the job's environment for its children. So, like memray, we patch the relocation slots (GOT) of
 * the loaded shared objects that import malloc, free, calloc, realloc, posix_memalign,
 * aligned_alloc, memalign, valloc, pvalloc and reallocarray, under both `arm()` and `blackbox run`;
 * objects loaded later (torch imported after arm) are patched at the next sampler tick; disarm puts
 * every slot that still holds our hook back. Each hook forwards to the definition the slot resolved
 * to (the global one: glibc's, or a jemalloc/tcmalloc the job LD_PRELOADs), so which allocator serves
 * a block never changes: a block allocated before disarm and freed after goes to the same free.
 * Python's small objects come from pymalloc's arenas, which malloc never sees: for those, the MEM
 * and OBJ domains are wrapped with PyMem_SetAllocator (the GIL is held there), forwarding to the
 * allocator found in place (pymalloc, or malloc under PYTHONMALLOC=malloc, or tracemalloc's).
 *
 * Sampling (Go's runtime.MemProfileRate, tcmalloc): a per-thread byte countdown drawn from an
 * exponential distribution of mean R. An allocation that takes it below zero is sampled (so one of
 * size s is sampled with probability p = 1 - exp(-s/R), each independently) and the countdown is
 * drawn afresh. A sample stands for w = s / p bytes, so summed weights are an unbiased estimate of
 * the bytes, and sum((1 - p) w^2) an unbiased estimate of that sum's variance.
 *
 * The hook never takes a lock, never waits, never calls the hooked allocators (a thread-local guard
 * makes every allocation made inside a hook, or inside the allocator a PyMem hook forwards to, go
 * straight through), never creates a Python object and needs no GIL: the allocating thread's own
 * Python frames are stable while it runs C code (a torch op that released the GIL included), and are
 * read from the interpreter's frame structs (code object and instruction only). The fast path is a
 * thread-local subtraction; the free path one bit of a 16 KiB filter (never unmapped) looked up: a bit, not the
 * count beside it (a byte each, 128 KiB, missed the cache on most native frees of a GPT step: perf put 0.3% of
 * its time on that one load, 0.2% on the whole free path with bits; docs/performance.md, round 3).
 *
 * Where the samples go (FORMAT.md, "Heap table", version 4): each sampled block takes a slot of the
 * ring file's heap table (address, size, weight, stack, time, thread, step, check word written last
 * but for the address, which publishes it), and each sample and each free of a sampled block is an
 * alloc_sample / free_sample record in the ring. The heap table is what was live at the kill, however
 * long ago it was allocated; the records are the timeline. A record and a slot name their stack by a
 * 64-bit fingerprint of its (code object, instruction) pairs. The stack's text is formatted here, in
 * C, the first time a fingerprint is seen, into a pending entry; the sampler tick (Python, with the
 * GIL) writes it into the stack table (an entry of kind 3 keyed by the fingerprint). So at a kill
 * the only stacks without text are those first seen since the last tick (at most one sample
 * interval), plus any that found the pending queue full (retried at their next sample).
 *
 * Fork: a pthread_atfork child handler turns every hook into a plain forward before any code runs in
 * the child (the heap table is the parent's file); the recorder then puts PyMem's allocators back and
 * leaves the patched slots forwarding (walking the loaded objects again there could wait on a loader
 * lock a vanished parent thread held); a child that arms its own ring samples through them again.
 *
 * Under an address-space limit (`ulimit -v`) the hooks also serve the recorder's sampler thread from a small
 * heap of its own, so that glibc never reserves an arena of 64 MiB for it (_own_heap.h says why and how).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX >= 0x030B0000
#define Py_BUILD_CORE 1
#undef _PyGC_FINALIZED
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#include <frameobject.h> /* 3.10: PyFrameObject's fields (f_back, f_code, f_lasti) */
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <elf.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define RECORD_SIZE 128
#define PAYLOAD_WORDS 9
#define FLAG_VALUE 1
#define KIND_ALLOC_SAMPLE 25
#define KIND_FREE_SAMPLE 26
#define DOMAIN_PYTHON 1
#define DOMAIN_NATIVE 2
#define DOMAIN_GPU 3
#define HEAP_SLOT 64
#define BUCKET 8
#define MAX_DEPTH 64
#define MAX_FRAME 1024
#define FILTER_SIZE (1u << 17)
#define SEEN_SLOTS (1u << 16)
#define SEEN_PROBES 64
#define PENDING 64
#define PENDING_TEXT (16 << 10)
#define NO_PYTHON_STACK 1ULL /* fingerprint of a thread with no Python frames (FORMAT.md) */
#define BUSY 1ULL            /* an index slot being filled or emptied */
#define GPU_KEY (1ULL << 63) /* index keys of GPU blocks: bit 63 (never set in a host address) */
#define GPU_DEVICE (0xFFULL << 55) /* and the device, bits 55..62 */
#define MAX_PATCHED 8192
#define MAX_OBJECTS 2048

/* ------------------------------------------------------------------ state */
typedef struct {
    int64_t countdown;
    uint64_t rng;
    uint32_t guard;    /* > 0: inside a hook or a forwarded allocator: go straight through */
    uint32_t nosample; /* the recorder's own sampler thread: frees are tracked, nothing sampled */
    uint32_t own;      /* the own heap (_own_heap.h): 1 this thread serves from it, 2 it did and let go */
    uint64_t epoch;    /* the arming this thread's countdown was drawn for */
    double mean;       /* the mean R its countdown was drawn with (R may be raised since: set_mean) */
} Local;
/* initial-exec: a thread-pointer-relative load, no __tls_get_addr call on the hot path (the few bytes
 * come from the static TLS surplus glibc keeps for modules loaded later) */
static __thread Local tls __attribute__((tls_model("initial-exec")));

#include "_own_heap.h"

typedef struct {
    int state; /* 0 free, 1 being filled, 2 ready for the tick */
    uint32_t nframes, depth, used;
    uint64_t hash, thread;
    uint16_t off[MAX_DEPTH + 1];
    char text[PENDING_TEXT];
} Pending;

static struct {
    int active;   /* atomic: hooks sample and track */
    int forked;   /* set in a forked child: hooks only forward */
    int inflight; /* atomic: slow paths inside the ring mapping */
    uint64_t epoch;
    double mean;  /* R, bytes */
    int64_t step; /* the step in force at the last tick */
    uint64_t *seq;
    char *records;
    uint64_t cap;
    char *heap;   /* heap table slots in the mapping */
    uint64_t slots, buckets;
    Py_buffer view;
    int have_view;
    PyObject *seq_ref;
    /* anonymous, allocated once and never unmapped: safe for a hook that outlives a disarm */
    uint64_t *index; /* address per index entry: 0 empty, BUSY, or the block */
    uint32_t *fslot; /* per index entry: its slot in the file's heap table */
    uint64_t *used;  /* a bit per file slot: taken */
    uint64_t hint;   /* atomic: no free file slot below this word of used (a heuristic) */
    uint64_t index_slots;
    uint8_t *filter; /* per hash of an address: how many tracked blocks (saturating; the slow paths only) */
    uint64_t *fbits; /* a bit per hash of an address: some tracked block there (what the free path reads) */
    uint64_t *seen;  /* stack fingerprints whose text is queued or written */
    Pending *pending;
    int64_t queued; /* atomic: pending entries ready for the tick (state 2): the tick reads them only if any */
    /* counters */
    uint64_t samples, frees, table_full, stale, pending_full, seen_full;
} g;

/* ------------------------------------------------------------------ small helpers */
static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline int dev_of(uint64_t key) { return (int)((key & GPU_DEVICE) >> 55); }
static inline uint64_t addr_hash(const void *p) { return mix64((uint64_t)(uintptr_t)p >> 4); }
/* The free path's filter: cheap, from the address alone (blocks are 16-byte aligned). */
static inline uint32_t filter_of(uint64_t a) { return (uint32_t)((a >> 4) ^ (a >> 21)) & (FILTER_SIZE - 1); }

/* A tracked block's count in the filter, and its bit: set after the count is raised; cleared where the count
 * fell to 0, then set again if a claim raised it meanwhile (so a bit is never clear while its count is not). */
static void filter_add(uint64_t a) {
    uint32_t i = filter_of(a);
    if (__atomic_load_n(&g.filter[i], __ATOMIC_RELAXED) != 255)
        __atomic_add_fetch(&g.filter[i], 1, __ATOMIC_SEQ_CST);
    __atomic_or_fetch(&g.fbits[i / 64], 1ULL << (i % 64), __ATOMIC_SEQ_CST);
}

static void filter_sub(uint64_t a) {
    uint32_t i = filter_of(a);
    if (__atomic_load_n(&g.filter[i], __ATOMIC_RELAXED) == 255 ||
        __atomic_sub_fetch(&g.filter[i], 1, __ATOMIC_SEQ_CST) != 0)
        return;
    __atomic_and_fetch(&g.fbits[i / 64], ~(1ULL << (i % 64)), __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g.filter[i], __ATOMIC_SEQ_CST) != 0)
        __atomic_or_fetch(&g.fbits[i / 64], 1ULL << (i % 64), __ATOMIC_SEQ_CST);
}

/* Exponential draw of mean R (at least 1 byte), from a per-thread xorshift64*. */
static int64_t draw(Local *t) {
    uint64_t x = t->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t->rng = x;
    double u = ((double)((x * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    __atomic_load(&g.mean, &t->mean, __ATOMIC_RELAXED); /* set_mean may raise it on another thread */
    double d = -log(u) * t->mean;
    return d >= 4e18 ? (int64_t)4e18 : (int64_t)d + 1;
}

static void seed(Local *t) {
    uint64_t s = mix64((uint64_t)(uintptr_t)t ^ (uint64_t)now_ns() ^ (g.epoch << 32));
    t->rng = s ? s : 0x9E3779B97F4A7C15ULL;
    t->epoch = g.epoch;
}

/* ------------------------------------------------------------------ records */
static void put_record(int kind, int64_t value, const int64_t *payload, int device) {
    uint64_t seq = __atomic_add_fetch(g.seq, 1, __ATOMIC_RELAXED);
    int64_t t = now_ns();
    uint64_t *q = (uint64_t *)(g.records + (seq % g.cap) * RECORD_SIZE);
    __atomic_store_n(&q[0], seq, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    q[1] = (uint64_t)t;
    q[2] = (uint64_t)pthread_self();
    q[3] = (uint64_t)-1; /* the step: readers take it from the record before (FORMAT.md) */
    q[4] = (uint64_t)value;
    q[5] = (uint64_t)kind << 32 | (uint64_t)FLAG_VALUE << 40 | ((uint64_t)device & 0xFFFF) << 48;
    memcpy(&q[6], payload, PAYLOAD_WORDS * 8);
    __atomic_store_n(&q[15], seq, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------ the heap table
 * Two-choice buckets of 8 slots; the index (anonymous memory) holds the addresses the free path
 * looks up, the mapping holds the slot's data, published by its address word (written last). */
static inline uint64_t heap_check(const uint64_t *s) {
    uint64_t c = 0;
    for (int i = 0; i < 7; i++)
        c = mix64(c ^ s[i]);
    return c;
}

static void buckets_of(uint64_t h, uint64_t *b1, uint64_t *b2) {
    *b1 = h % g.buckets;
    *b2 = mix64(h) % g.buckets;
}

/* The file's heap slots are handed out lowest first (a bit per slot in ``used``; ``hint``: no free slot
 * below that word, a heuristic a race may leave high, which only leaves a slot unused a while), so the
 * live blocks' slots pack into the first pages of the table: the pages a tick's hooks write, and that
 * the mapping then holds until the tick drops them (a page-cache folio is mapped whole), stay few
 * however the blocks' addresses hash. The index (by address) holds each entry's file slot in fslot. */
static int64_t file_claim(void) {
    uint64_t words = (g.slots + 63) / 64;
    for (uint64_t w = __atomic_load_n(&g.hint, __ATOMIC_RELAXED); w < words; w++) {
        uint64_t v = __atomic_load_n(&g.used[w], __ATOMIC_RELAXED);
        while (v != ~0ULL) {
            uint64_t bit = 1ULL << __builtin_ctzll(~v);
            if (__atomic_compare_exchange_n(&g.used[w], &v, v | bit, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                if ((v | bit) == ~0ULL) {
                    uint64_t expect = w;
                    __atomic_compare_exchange_n(&g.hint, &expect, w + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
                }
                return (int64_t)(w * 64 + (uint64_t)__builtin_ctzll(bit));
            }
        }
    }
    return -1;
}

static void file_release(uint64_t f) {
    uint64_t w = f / 64, h = __atomic_load_n(&g.hint, __ATOMIC_RELAXED);
    __atomic_and_fetch(&g.used[w], ~(1ULL << (f % 64)), __ATOMIC_RELEASE);
    while (w < h && !__atomic_compare_exchange_n(&g.hint, &h, w, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

/* Claim an index entry for block p and its file slot (an entry already there for p is a block freed where
 * no hook saw it: replaced, its file slot reused). Returns the entry, or -1 when both buckets or the file's
 * slots are full; *f: the file slot. */
static int64_t heap_claim(uint64_t p, uint64_t h, int64_t *f) {
    uint64_t b[2];
    buckets_of(h, &b[0], &b[1]);
    for (int k = 0; k < 2; k++)
        for (uint64_t j = b[k] * BUCKET; j < (b[k] + 1) * BUCKET; j++) {
            uint64_t expect = p;
            if (__atomic_load_n(&g.index[j], __ATOMIC_RELAXED) == p &&
                __atomic_compare_exchange_n(&g.index[j], &expect, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                *f = g.fslot[j];
                __atomic_store_n((uint64_t *)(g.heap + (uint64_t)*f * HEAP_SLOT), 0, __ATOMIC_RELEASE);
                __atomic_add_fetch(&g.stale, 1, __ATOMIC_RELAXED);
                return (int64_t)j;
            }
        }
    for (int k = 0; k < 2; k++)
        for (uint64_t j = b[k] * BUCKET; j < (b[k] + 1) * BUCKET; j++) {
            uint64_t expect = 0;
            if (__atomic_load_n(&g.index[j], __ATOMIC_RELAXED) == 0 &&
                __atomic_compare_exchange_n(&g.index[j], &expect, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                *f = file_claim();
                if (*f < 0) {
                    __atomic_store_n(&g.index[j], 0, __ATOMIC_RELEASE);
                    return -1;
                }
                filter_add(p);
                return (int64_t)j;
            }
        }
    return -1;
}

/* key: what the index holds (the address; a GPU block's with GPU_KEY and its device set, so it never
 * meets a host address); addr: the block's address, written into file slot f. */
static void heap_fill(int64_t j, int64_t f, uint64_t key, uint64_t p, uint64_t size, uint64_t weight, uint64_t stack,
                      int64_t t, int domain) {
    uint64_t *s = (uint64_t *)(g.heap + (uint64_t)f * HEAP_SLOT);
    uint64_t w[8];
    w[0] = p;
    w[1] = size;
    w[2] = weight;
    w[3] = stack;
    w[4] = (uint64_t)t;
    w[5] = (uint64_t)pthread_self();
    w[6] = (uint64_t)(uint32_t)(int32_t)g.step | (uint64_t)domain << 32;
    w[7] = heap_check(w);
    memcpy(&s[1], &w[1], 7 * 8);
    __atomic_store_n(&s[0], p, __ATOMIC_RELEASE); /* publishes the slot */
    g.fslot[j] = (uint32_t)f;
    __atomic_store_n(&g.index[j], key, __ATOMIC_RELEASE);
}

/* Find and empty p's entry and file slot: 1 with its data in out[0..3] (size, weight, stack, domain) and the
 * file slot in *slot, else 0. */
static int heap_take(uint64_t p, uint64_t h, int64_t *slot, uint64_t out[4]) {
    uint64_t b[2];
    buckets_of(h, &b[0], &b[1]);
    for (int k = 0; k < 2; k++)
        for (uint64_t j = b[k] * BUCKET; j < (b[k] + 1) * BUCKET; j++) {
            uint64_t expect = p;
            if (__atomic_load_n(&g.index[j], __ATOMIC_RELAXED) != p ||
                !__atomic_compare_exchange_n(&g.index[j], &expect, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                continue;
            uint64_t f = g.fslot[j];
            uint64_t *s = (uint64_t *)(g.heap + f * HEAP_SLOT);
            out[0] = s[1];
            out[1] = s[2];
            out[2] = s[3];
            out[3] = (s[6] >> 32) & 0xFFFF;
            __atomic_store_n(&s[0], 0, __ATOMIC_RELEASE);
            file_release(f);
            __atomic_store_n(&g.index[j], 0, __ATOMIC_RELEASE);
            filter_sub(p);
            *slot = (int64_t)f;
            return 1;
        }
    return 0;
}

/* ------------------------------------------------------------------ Python frames */
typedef struct {
    void *code;
    int lasti; /* bytes */
} FrameRef;

/* The calling thread's frames, innermost first (at most MAX_DEPTH); returns how many, *depth all. */
static int walk_frames(FrameRef *out, int *depth) {
    *depth = 0;
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing())
        return 0;
#else
    if (_Py_IsFinalizing())
        return 0;
#endif
    PyThreadState *ts = PyGILState_GetThisThreadState();
    if (ts == NULL)
        return 0;
    int n = 0, d = 0;
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
    for (; f != NULL; f = f->previous) {
        if (f->owner == FRAME_OWNED_BY_CSTACK || _PyFrame_IsIncomplete(f) || !PyCode_Check(f->f_executable))
            continue;
        if (n < MAX_DEPTH) {
            PyCodeObject *code = (PyCodeObject *)f->f_executable;
            out[n].code = code;
            out[n].lasti = (int)((char *)f->instr_ptr - (char *)_PyCode_CODE(code));
            n++;
        }
        d++;
    }
#elif PY_VERSION_HEX >= 0x030B0000
    _PyCFrame *cf = ts->cframe;
    _PyInterpreterFrame *f = cf ? cf->current_frame : NULL;
    for (; f != NULL; f = f->previous) {
#if PY_VERSION_HEX >= 0x030C0000
        if (f->owner == FRAME_OWNED_BY_CSTACK)
            continue;
#endif
        if (_PyFrame_IsIncomplete(f))
            continue;
        if (n < MAX_DEPTH) {
            out[n].code = f->f_code;
            out[n].lasti = _PyInterpreterFrame_LASTI(f) * (int)sizeof(_Py_CODEUNIT);
            n++;
        }
        d++;
    }
#else
    PyFrameObject *f = ts->frame;
    for (; f != NULL; f = f->f_back) {
        if (n < MAX_DEPTH) {
            out[n].code = f->f_code;
            out[n].lasti = f->f_lasti * 2;
            n++;
        }
        d++;
    }
#endif
    *depth = d;
    return n;
}

static uint64_t fingerprint(const FrameRef *frames, int n, int depth) {
    if (n == 0)
        return NO_PYTHON_STACK;
    uint64_t h = 0xCBF29CE484222325ULL ^ (uint64_t)depth;
    for (int i = 0; i < n; i++)
        h = mix64(h ^ (uint64_t)(uintptr_t)frames[i].code) ^ (uint64_t)(uint32_t)frames[i].lasti;
    h = mix64(h);
    return h <= NO_PYTHON_STACK ? h + 2 : h;
}

/* UTF-8 of a str into out (at most cap bytes), ';' as ',' and line breaks as spaces (FORMAT.md). */
static size_t put_text(char *out, size_t cap, PyObject *s) {
    if (s == NULL || !PyUnicode_Check(s))
        return 0;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    size_t n = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c == ';')
            c = ',';
        else if (c == '\n' || c == '\r')
            c = ' ';
        char b[4];
        size_t k;
        if (c < 0x80) {
            b[0] = (char)c;
            k = 1;
        } else if (c < 0x800) {
            b[0] = (char)(0xC0 | (c >> 6));
            b[1] = (char)(0x80 | (c & 0x3F));
            k = 2;
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF)
                c = '?';
            b[0] = (char)(0xE0 | (c >> 12));
            b[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            b[2] = (char)(0x80 | (c & 0x3F));
            k = c == '?' ? (b[0] = '?', 1) : 3;
        } else {
            b[0] = (char)(0xF0 | (c >> 18));
            b[1] = (char)(0x80 | ((c >> 12) & 0x3F));
            b[2] = (char)(0x80 | ((c >> 6) & 0x3F));
            b[3] = (char)(0x80 | (c & 0x3F));
            k = 4;
        }
        if (n + k > cap)
            break;
        memcpy(out + n, b, k);
        n += k;
    }
    return n;
}

/* "function (file:line)" of one frame, like collect/stacks.py's frame_text (a long file is cut). */
static size_t frame_text(const FrameRef *f, char *out, size_t cap) {
    PyCodeObject *code = (PyCodeObject *)f->code;
    char tail[32];
    int line = PyCode_Addr2Line(code, f->lasti);
    int tl = snprintf(tail, sizeof tail, ":%d)", line < 0 ? 0 : line);
    if (cap > MAX_FRAME)
        cap = MAX_FRAME;
    if (cap < (size_t)tl + 8)
        return 0;
    size_t room = cap - (size_t)tl;
#if PY_VERSION_HEX >= 0x030B0000
    size_t n = put_text(out, room / 2, code->co_qualname);
#else
    size_t n = put_text(out, room / 2, code->co_name);
#endif
    memcpy(out + n, " (", 2);
    n += 2;
    n += put_text(out + n, room - n, code->co_filename);
    memcpy(out + n, tail, (size_t)tl);
    return n + (size_t)tl;
}

/* ------------------------------------------------------------------ stacks awaiting the tick */
static int seen_has(uint64_t h) {
    uint64_t i = h & (SEEN_SLOTS - 1);
    for (int k = 0; k < SEEN_PROBES; k++, i = (i + 1) & (SEEN_SLOTS - 1)) {
        uint64_t v = __atomic_load_n(&g.seen[i], __ATOMIC_ACQUIRE);
        if (v == h)
            return 1;
        if (v == 0)
            return 0;
    }
    return 1; /* a full neighbourhood: treat as seen (counted at insert) */
}

static int seen_add(uint64_t h) {
    uint64_t i = h & (SEEN_SLOTS - 1);
    for (int k = 0; k < SEEN_PROBES; k++, i = (i + 1) & (SEEN_SLOTS - 1)) {
        uint64_t expect = 0;
        if (__atomic_compare_exchange_n(&g.seen[i], &expect, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
        if (expect == h)
            return 0;
    }
    __atomic_add_fetch(&g.seen_full, 1, __ATOMIC_RELAXED);
    return 0;
}

/* ------------------------------------------------------------------ the stack table's tail
 * A stack first seen is written at once into the ring's stack table too, so that its text reaches the
 * file however soon the process dies (the tick's copy, with the thread's name and the source line,
 * follows within a sample interval). The last TAIL bytes of the current generation's half are the
 * hooks' own: entries (FORMAT.md, "Stack table": frames, then the kind-3 entry naming them) are
 * appended at an atomically claimed cursor that wraps, so a burst of new stacks overwrites the oldest
 * tail entries (the tick has copied those by then; a torn or overwritten entry fails its CRC and is
 * skipped by readers). Frame ids here count from TAIL_IDS, never met by the tick's. The tick moves
 * the tail to the next generation's half when the table turns over (set_tail), waiting for a hook in
 * flight there; a hook never waits. */
#define TAIL_IDS 0x80000000u
#define NAMES 512     /* threads whose name the hooks can write (the tick keeps it: name_threads) */
#define NAME_BYTES 56
typedef struct {
    uint64_t thread; /* atomic: 0 while the name is being written */
    char name[NAME_BYTES];
} ThreadName;
static ThreadName g_names[NAMES];

/* The calling thread's name as the tick last gave it (0 bytes where unknown), into out. */
static uint32_t thread_name(char out[NAME_BYTES]) {
    uint64_t me = (uint64_t)pthread_self(), i = mix64(me) % NAMES;
    for (int k = 0; k < 8; k++, i = (i + 1) % NAMES) {
        if (__atomic_load_n(&g_names[i].thread, __ATOMIC_ACQUIRE) != me)
            continue;
        memcpy(out, g_names[i].name, NAME_BYTES);
        if (__atomic_load_n(&g_names[i].thread, __ATOMIC_ACQUIRE) != me) /* rewritten meanwhile */
            return 0;
        return (uint32_t)strnlen(out, NAME_BYTES);
    }
    return 0;
}
static uint32_t crc_table[256];
static struct {
    int on;       /* atomic */
    int inflight; /* atomic: hooks writing into the tail */
    char *base;
    uint64_t size;
    uint32_t gen;
    uint64_t cursor;  /* atomic: bytes claimed since set_tail */
    uint32_t next_id; /* atomic */
    uint64_t written, dropped;
} tl;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* zlib's crc32(data, start) */
static uint32_t crc32_of(uint32_t start, const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t c = start ^ 0xFFFFFFFFu;
    while (n--)
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* One entry (format.stack_entry: generation u4, kind u2, flags u2, id u4, length u4, crc u4, reserved u4,
 * the payload zero padded to 8) written into the tail; 0 where it cannot be (off, or too long). */
static int tail_put(uint32_t gen, uint16_t kind, uint32_t id, const void *payload, uint32_t len) {
    uint64_t size = (24 + (uint64_t)len + 7) & ~7ULL;
    if (size > tl.size / 4)
        return 0;
    unsigned char head[14];
    memcpy(head, &gen, 4);
    memcpy(head + 4, &kind, 2);
    memcpy(head + 6, &id, 4);
    memcpy(head + 10, &len, 4);
    uint32_t crc = crc32_of(crc32_of(0, head, 14), payload, len);
    for (;;) {
        uint64_t at = __atomic_fetch_add(&tl.cursor, size, __ATOMIC_RELAXED) % tl.size;
        char *p = tl.base + at;
        if (at + size > tl.size) { /* it would cross the end: this run is ours, zeroed; claim again */
            memset(p, 0, tl.size - at);
            continue;
        }
        uint32_t words[6] = {gen, (uint32_t)kind, id, len, crc, 0};
        memset(p, 0, 24); /* the header last but its first word: a torn entry fails its CRC */
        memcpy(p + 24, payload, len);
        memset(p + 24 + len, 0, size - 24 - len);
        memcpy(p + 4, &words[1], 20);
        __atomic_store_n((uint32_t *)p, gen, __ATOMIC_RELEASE);
        return 1;
    }
}

/* The kind-3 entry (format.alloc_stack_payload: fingerprint u8, depth u4, n u4, the frame ids outermost
 * first, then the thread's name where the tick gave it, and no source line: the tick's copy has it) for
 * frames ``ids``, innermost first. */
static int tail_alloc(uint32_t gen, uint64_t h, int depth, const uint32_t *ids, uint32_t nframes) {
    unsigned char payload[16 + 4 * MAX_DEPTH + NAME_BYTES + 1];
    uint32_t d = (uint32_t)depth, at = 16 + 4 * nframes;
    memcpy(payload, &h, 8);
    memcpy(payload + 8, &d, 4);
    memcpy(payload + 12, &nframes, 4);
    for (uint32_t k = 0; k < nframes; k++)
        memcpy(payload + 16 + 4 * k, &ids[nframes - 1 - k], 4);
    at += thread_name((char *)payload + at);
    payload[at++] = 0;
    uint32_t sid = TAIL_IDS + __atomic_fetch_add(&tl.next_id, 1, __ATOMIC_RELAXED) % TAIL_IDS;
    return tail_put(gen, 3, sid, payload, at);
}

/* The stack's frames and its kind-3 entry into the tail: ``texts`` holds the frames' text, innermost
 * first, frame k at [off[k], off[k + 1]). */
static void tail_stack(uint64_t h, int depth, const char *texts, const uint16_t *off, uint32_t nframes) {
    __atomic_add_fetch(&tl.inflight, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&tl.on, __ATOMIC_SEQ_CST)) {
        __atomic_sub_fetch(&tl.inflight, 1, __ATOMIC_SEQ_CST);
        return;
    }
    uint32_t gen = tl.gen, ids[MAX_DEPTH];
    int ok = 1;
    for (uint32_t k = 0; k < nframes && ok; k++) {
        ids[k] = TAIL_IDS + __atomic_fetch_add(&tl.next_id, 1, __ATOMIC_RELAXED) % TAIL_IDS;
        ok = tail_put(gen, 1, ids[k], texts + off[k], (uint32_t)(off[k + 1] - off[k]));
    }
    if (ok)
        ok = tail_alloc(gen, h, depth, ids, nframes);
    __atomic_add_fetch(ok ? &tl.written : &tl.dropped, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&tl.inflight, 1, __ATOMIC_SEQ_CST);
}

static void tail_off(void) {
    __atomic_store_n(&tl.on, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&tl.inflight, __ATOMIC_SEQ_CST) != 0)
        sched_yield();
}

/* ------------------------------------------------------------------ stacks awaiting the tick */
static void format_frames(const FrameRef *frames, int n, char *text, uint16_t *off, uint32_t *nframes,
                          uint32_t *used_out) {
    uint32_t used = 0, k = 0;
    for (; k < (uint32_t)n; k++) {
        off[k] = (uint16_t)used;
        used += (uint32_t)frame_text(&frames[k], text + used, PENDING_TEXT - used);
        if (PENDING_TEXT - used < 64) {
            k++;
            break;
        }
    }
    off[k] = (uint16_t)used;
    *nframes = k;
    *used_out = used;
}

static void queue_stack(uint64_t h, const FrameRef *frames, int n, int depth) {
    if (n == 0 || seen_has(h))
        return;
    for (int i = 0; i < PENDING; i++) {
        int expect = 0;
        Pending *e = &g.pending[i];
        if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) != 0 ||
            !__atomic_compare_exchange_n(&e->state, &expect, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        if (!seen_add(h)) {
            __atomic_store_n(&e->state, 0, __ATOMIC_RELEASE);
            return;
        }
        format_frames(frames, n, e->text, e->off, &e->nframes, &e->used);
        e->depth = (uint32_t)depth;
        e->hash = h;
        e->thread = (uint64_t)pthread_self();
        tail_stack(h, depth, e->text, e->off, e->nframes); /* in the ring now; the tick's copy follows */
        __atomic_store_n(&e->state, 2, __ATOMIC_RELEASE);
        __atomic_add_fetch(&g.queued, 1, __ATOMIC_RELEASE);
        return;
    }
    /* No pending entry free (a burst of new stacks within one tick): the text still goes into the ring's
     * tail, a frame at a time; not marked seen, so a later sample of this stack queues it for the tick. */
    __atomic_add_fetch(&g.pending_full, 1, __ATOMIC_RELAXED);
    char one[MAX_FRAME + 8];
    uint16_t off[2] = {0, 0};
    uint32_t ids[MAX_DEPTH], k = 0;
    __atomic_add_fetch(&tl.inflight, 1, __ATOMIC_SEQ_CST);
    int ok = __atomic_load_n(&tl.on, __ATOMIC_SEQ_CST);
    uint32_t gen = tl.gen;
    for (; k < (uint32_t)n && ok; k++) {
        off[1] = (uint16_t)frame_text(&frames[k], one, sizeof one);
        ids[k] = TAIL_IDS + __atomic_fetch_add(&tl.next_id, 1, __ATOMIC_RELAXED) % TAIL_IDS;
        ok = tail_put(gen, 1, ids[k], one, off[1]);
    }
    if (ok)
        ok = tail_alloc(gen, h, depth, ids, k);
    __atomic_add_fetch(ok ? &tl.written : &tl.dropped, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&tl.inflight, 1, __ATOMIC_SEQ_CST);
}

/* ------------------------------------------------------------------ the slow paths */
static void on_sample(Local *t, void *ptr, size_t size, int domain) {
    if (t->epoch != g.epoch || t->rng == 0) { /* this thread's first countdown for this arming */
        seed(t);
        t->countdown = draw(t) - (int64_t)size;
        if (t->countdown >= 0)
            return;
    }
    double mean = t->mean; /* the mean of the countdown that ran out: the block's probability (set_mean) */
    t->countdown = draw(t);
    if (ptr == NULL || t->nosample || !__atomic_load_n(&g.active, __ATOMIC_ACQUIRE))
        return;
    t->guard++;
    __atomic_add_fetch(&g.inflight, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g.active, __ATOMIC_SEQ_CST) && !g.forked) {
        FrameRef frames[MAX_DEPTH];
        int depth, n = walk_frames(frames, &depth);
        uint64_t stack = fingerprint(frames, n, depth);
        queue_stack(stack, frames, n, depth);
        double s = (double)size, p = -expm1(-s / mean);
        uint64_t weight = (uint64_t)(p > 0 ? s / p + 0.5 : s);
        uint64_t addr = (uint64_t)(uintptr_t)ptr, h = addr_hash(ptr);
        int64_t slot = -1, entry = heap_claim(addr, h, &slot), time = now_ns();
        if (entry >= 0)
            heap_fill(entry, slot, addr, addr, size, weight, stack, time, domain);
        else
            __atomic_add_fetch(&g.table_full, 1, __ATOMIC_RELAXED);
        int64_t payload[PAYLOAD_WORDS] = {(int64_t)addr, (int64_t)weight, (int64_t)stack, domain, slot, 0, 0, 0, 0};
        put_record(KIND_ALLOC_SAMPLE, (int64_t)size, payload, -1);
        __atomic_add_fetch(&g.samples, 1, __ATOMIC_RELAXED);
    }
    __atomic_sub_fetch(&g.inflight, 1, __ATOMIC_SEQ_CST);
    t->guard--;
}

static void on_free(void *ptr) {
    Local *t = &tls;
    t->guard++;
    __atomic_add_fetch(&g.inflight, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g.active, __ATOMIC_SEQ_CST) && !g.forked) {
        uint64_t key = (uint64_t)(uintptr_t)ptr, d[4], addr = key & ~(GPU_KEY | GPU_DEVICE);
        int64_t slot;
        if (heap_take(key, addr_hash(ptr), &slot, d)) {
            int64_t payload[PAYLOAD_WORDS] = {(int64_t)addr, (int64_t)d[1], (int64_t)d[2], (int64_t)d[3], slot,
                                              0, 0, 0, 0};
            put_record(KIND_FREE_SAMPLE, (int64_t)d[0], payload, (int)d[3] == DOMAIN_GPU ? dev_of(key) : -1);
            __atomic_add_fetch(&g.frees, 1, __ATOMIC_RELAXED);
        }
    }
    __atomic_sub_fetch(&g.inflight, 1, __ATOMIC_SEQ_CST);
    t->guard--;
}

static inline int tracked(const void *p) {
    uint32_t i = filter_of((uint64_t)(uintptr_t)p);
    return p != NULL && (g.fbits[i / 64] >> (i % 64) & 1);
}

#define AFTER_ALLOC(p, n, domain)                                                                                   \
    do {                                                                                                           \
        Local *t_ = &tls;                                                                                          \
        if (!t_->guard && (t_->countdown -= (int64_t)(n)) < 0)                                                     \
            on_sample(t_, (p), (n), (domain));                                                                     \
    } while (0)
#define BEFORE_FREE(p)                                                                                             \
    do {                                                                                                           \
        if (tracked(p) && !tls.guard)                                                                              \
            on_free(p);                                                                                            \
    } while (0)

/* ------------------------------------------------------------------ PyMem domains (MEM, OBJ) */
typedef struct {
    PyMemAllocatorEx orig;
    PyMemAllocatorDomain domain;
    int installed;
} PyHook;
static PyHook g_py[2] = {{.domain = PYMEM_DOMAIN_MEM}, {.domain = PYMEM_DOMAIN_OBJ}};

static void *pm_malloc(void *ctx, size_t n) {
    PyHook *h = ctx;
    Local *t = &tls;
    t->guard++;
    void *p = h->orig.malloc(h->orig.ctx, n);
    t->guard--;
    AFTER_ALLOC(p, n, DOMAIN_PYTHON);
    return p;
}

static void *pm_calloc(void *ctx, size_t k, size_t n) {
    PyHook *h = ctx;
    Local *t = &tls;
    t->guard++;
    void *p = h->orig.calloc(h->orig.ctx, k, n);
    t->guard--;
    if (n == 0 || k <= SIZE_MAX / n)
        AFTER_ALLOC(p, k * n, DOMAIN_PYTHON);
    return p;
}

static void *pm_realloc(void *ctx, void *old, size_t n) {
    PyHook *h = ctx;
    BEFORE_FREE(old);
    Local *t = &tls;
    t->guard++;
    void *p = h->orig.realloc(h->orig.ctx, old, n);
    t->guard--;
    AFTER_ALLOC(p, n, DOMAIN_PYTHON);
    return p;
}

static void pm_free(void *ctx, void *p) {
    PyHook *h = ctx;
    BEFORE_FREE(p);
    Local *t = &tls;
    t->guard++;
    h->orig.free(h->orig.ctx, p);
    t->guard--;
}

static void py_install(void) {
    for (int i = 0; i < 2; i++) {
        PyHook *h = &g_py[i];
        if (h->installed)
            continue;
        PyMem_GetAllocator(h->domain, &h->orig);
        PyMemAllocatorEx mine = {h, pm_malloc, pm_calloc, pm_realloc, pm_free};
        PyMem_SetAllocator(h->domain, &mine);
        h->installed = 1;
    }
}

/* Put the allocators found at install back, where ours is still the one in place (another wrapper
 * installed since, tracemalloc say, keeps forwarding through ours, which then only forwards). */
static void py_uninstall(void) {
    for (int i = 0; i < 2; i++) {
        PyHook *h = &g_py[i];
        PyMemAllocatorEx cur;
        if (!h->installed)
            continue;
        PyMem_GetAllocator(h->domain, &cur);
        if (cur.ctx == h && cur.malloc == pm_malloc) {
            PyMem_SetAllocator(h->domain, &h->orig);
            h->installed = 0;
        }
    }
}

/* ------------------------------------------------------------------ native hooks */
static void *(*r_malloc)(size_t);
static void (*r_free)(void *);
static void *(*r_calloc)(size_t, size_t);
static void *(*r_realloc)(void *, size_t);
static int (*r_posix_memalign)(void **, size_t, size_t);
static void *(*r_aligned_alloc)(size_t, size_t);
static void *(*r_memalign)(size_t, size_t);
static void *(*r_valloc)(size_t);
static void *(*r_pvalloc)(size_t);
static void *(*r_reallocarray)(void *, size_t, size_t);

static size_t (*r_usable)(void *); /* glibc's malloc_usable_size, where the own heap is on */

/* The own heap's part of each hook (_own_heap.h), where it is on: the owner's requests are served from it (served
 * set), and another thread hands glibc the blocks the owner let go. */
#define OWN_ON() __builtin_expect(__atomic_load_n(&own.size, __ATOMIC_RELAXED) != 0, 0)

/* Whether this thread's frees of glibc's blocks wait for another thread: the owner's, one that was, and, while
 * the sampler starts (own.expect), a thread that never allocated through a hook (rng 0): the sampler before
 * it claims the heap frees the block its starter allocated for it, and glibc would give it an arena for that.
 * (A job thread taken for it only has a free put off a moment.) */
static inline int own_defers(void) {
    return tls.own != 0 || (__atomic_load_n(&own.expect, __ATOMIC_RELAXED) && tls.rng == 0);
}

static void own_other_thread(void) {
    if (__atomic_load_n(&own.deferred, __ATOMIC_RELAXED) != NULL && !own_defers())
        own_drain(r_free);
}

/* The owner's request, served from the own heap (served set), where it came through a serving slot (py_*
 * below); any other thread hands glibc the blocks the owner let go. */
static void *own_alloc_hook(size_t n, int zero, int serve, int *served) {
    *served = 0;
    if (!serve || !own_is_owner()) {
        own_other_thread();
        return NULL;
    }
    int fresh = 0;
    void *p = own_malloc(n, &fresh);
    if (p != NULL && zero && !fresh)
        memset(p, 0, n);
    *served = p != NULL;
    return p;
}

static int own_free_hook(void *p) {
    if (p == NULL)
        return 0;
    if (own_has(p)) {
        own_free(p);
        return 1;
    }
    if (own_defers()) { /* a glibc block: freed by another thread (glibc would give this one an arena) */
        BEFORE_FREE(p);
        own_push(&own.deferred, p);
        __atomic_add_fetch(&own.deferred_frees, 1, __ATOMIC_RELAXED);
        return 1;
    }
    own_other_thread();
    return 0;
}

static void *h_malloc(size_t n);

/* realloc where the own heap is on: a block of it grown or freed by any thread, and (serve: through a serving
 * slot) the owner's requests. Not served: glibc's realloc, as without it. */
static void *own_realloc_hook(void *old, size_t n, int serve, int *served) {
    int mine = old != NULL && own_has(old), owner = serve && own_is_owner();
    if (!mine && (!owner || old == NULL))
        return own_alloc_hook(n, 0, serve, served); /* (another thread: glibc's realloc, after the drain) */
    *served = 1;
    if (n == 0) { /* glibc: the block freed, NULL */
        own_free_hook(old);
        return NULL;
    }
    size_t have = own_usable(old, r_usable);
    if (n <= have) /* it fits where it is (a glibc block the owner shrinks stays glibc's) */
        return old;
    int fresh;
    void *q = owner ? own_malloc(n, &fresh) : NULL;
    if (q == NULL && !mine) {
        *served = 0; /* the owner's glibc block, no room here: glibc's realloc, as without this heap */
        return NULL;
    }
    if (q == NULL)
        q = owner ? r_malloc(n) : h_malloc(n); /* ours grown by its owner past the heap, or by another thread */
    if (q == NULL)
        return NULL;
    memcpy(q, old, have < n ? have : n);
    own_free_hook(old);
    return q;
}

/* malloc and realloc, where serve says whether the slot may serve the own heap's owner (own_serves: py_*) */
static inline void *malloc_by(size_t n, int serve) {
    if (OWN_ON()) {
        int served;
        void *q = own_alloc_hook(n, 0, serve, &served);
        if (served)
            return q;
    }
    void *p = r_malloc(n);
    AFTER_ALLOC(p, n, DOMAIN_NATIVE);
    return p;
}
static inline void *realloc_by(void *old, size_t n, int serve) {
    if (OWN_ON()) {
        int served;
        void *q = own_realloc_hook(old, n, serve, &served);
        if (served)
            return q;
    }
    BEFORE_FREE(old);
    void *p = r_realloc(old, n);
    AFTER_ALLOC(p, n, DOMAIN_NATIVE);
    return p;
}
static void *h_malloc(size_t n) { return malloc_by(n, 0); }
static void h_free(void *p) {
    if (OWN_ON() && own_free_hook(p))
        return;
    BEFORE_FREE(p);
    r_free(p);
}
static void *h_calloc(size_t k, size_t n) {
    void *p = r_calloc(k, n);
    if (n == 0 || k <= SIZE_MAX / n)
        AFTER_ALLOC(p, k * n, DOMAIN_NATIVE);
    return p;
}
static void *h_realloc(void *old, size_t n) { return realloc_by(old, n, 0); }
static int h_posix_memalign(void **out, size_t align, size_t n) {
    int r = r_posix_memalign(out, align, n);
    if (r == 0)
        AFTER_ALLOC(*out, n, DOMAIN_NATIVE);
    return r;
}
static void *h_aligned_alloc(size_t align, size_t n) {
    void *p = r_aligned_alloc(align, n);
    AFTER_ALLOC(p, n, DOMAIN_NATIVE);
    return p;
}
static void *h_memalign(size_t align, size_t n) {
    void *p = r_memalign(align, n);
    AFTER_ALLOC(p, n, DOMAIN_NATIVE);
    return p;
}
static void *h_valloc(size_t n) {
    void *p = r_valloc(n);
    AFTER_ALLOC(p, n, DOMAIN_NATIVE);
    return p;
}
static void *h_pvalloc(size_t n) {
    void *p = r_pvalloc(n);
    AFTER_ALLOC(p, n, DOMAIN_NATIVE);
    return p;
}
static void *h_reallocarray(void *old, size_t k, size_t n) {
    if (OWN_ON() && (n == 0 || k <= SIZE_MAX / n)) {
        int served;
        void *q = own_realloc_hook(old, k * n, 0, &served);
        if (served)
            return q;
    }
    BEFORE_FREE(old);
    void *p = r_reallocarray(old, k, n);
    if (n == 0 || k <= SIZE_MAX / n)
        AFTER_ALLOC(p, k * n, DOMAIN_NATIVE);
    return p;
}

/* The slots of libpython (or the executable it is linked into), numpy's core and the ring writer (own_serves):
 * the one place the own heap serves the owner from. What they allocate there they free through a hooked free
 * (a slot left on our hook at disarm); another library's block could go back through a free that was never
 * hooked (libc's own, inside getline; an object loaded since the last scan), where glibc would abort on it.
 * Elsewhere the hooks above forward. */
static void *py_malloc(size_t n) { return malloc_by(n, 1); }
static void *py_calloc(size_t k, size_t n) {
    if (OWN_ON() && (n == 0 || k <= SIZE_MAX / n)) {
        int served;
        void *q = own_alloc_hook(k * n, 1, 1, &served);
        if (served)
            return q;
    }
    return h_calloc(k, n);
}
static void *py_realloc(void *old, size_t n) { return realloc_by(old, n, 1); }

/* dlsym, in the objects that hand Python code a C function by name (ctypes, cffi) alone: a malloc looked
 * up there (``ctypes.CDLL(None).malloc``) gets the forwarding hook, so its blocks are sampled with the
 * Python stack that called it. Everything else is glibc's answer, unchanged. One caveat: a lookup with
 * RTLD_NEXT (which ctypes and cffi never pass themselves) resolves after this module, not after theirs. */
static void *(*r_dlsym)(void *, const char *);
static void *h_dlsym(void *handle, const char *name);

typedef struct {
    const char *name;
    void *hook;
    void **real;
    void *py; /* a serving slot's hook (own_serves), where it differs (the own heap) */
} HookDef;
static HookDef g_hooks[] = {
    {"malloc", (void *)h_malloc, (void **)&r_malloc, (void *)py_malloc},
    {"free", (void *)h_free, (void **)&r_free},
    {"calloc", (void *)h_calloc, (void **)&r_calloc, (void *)py_calloc},
    {"realloc", (void *)h_realloc, (void **)&r_realloc, (void *)py_realloc},
    {"posix_memalign", (void *)h_posix_memalign, (void **)&r_posix_memalign},
    {"aligned_alloc", (void *)h_aligned_alloc, (void **)&r_aligned_alloc},
    {"memalign", (void *)h_memalign, (void **)&r_memalign},
    {"valloc", (void *)h_valloc, (void **)&r_valloc},
    {"pvalloc", (void *)h_pvalloc, (void **)&r_pvalloc},
    {"reallocarray", (void *)h_reallocarray, (void **)&r_reallocarray},
    {"dlsym", (void *)h_dlsym, (void **)&r_dlsym}, /* last: patched only where dlsym_object says */
};
#define NHOOKS ((int)(sizeof g_hooks / sizeof g_hooks[0]))

static void *h_dlsym(void *handle, const char *name) {
    void *r = r_dlsym(handle, name);
    if (r != NULL)
        for (int k = 0; k < NHOOKS - 1; k++)
            if (r == *g_hooks[k].real)
                return g_hooks[k].hook;
    return r;
}

/* Whether an object's dlsym slot is patched: ctypes' and cffi's extension modules. */
static int dlsym_object(const char *name) {
    return name != NULL && (strstr(name, "/_ctypes") != NULL || strstr(name, "/_cffi_backend") != NULL);
}

static int resolve_reals(void) {
    for (int i = 0; i < NHOOKS; i++)
        if (*g_hooks[i].real == NULL)
            *g_hooks[i].real = dlsym(RTLD_DEFAULT, g_hooks[i].name);
    return r_malloc != NULL && r_free != NULL && r_calloc != NULL && r_realloc != NULL;
}

/* ------------------------------------------------------------------ GOT patching */
typedef struct {
    uintptr_t slot, orig, base;
    uint64_t name; /* hash of the object's path: with base, names the object */
} Patched;
static Patched g_patched[MAX_PATCHED];
static int g_npatched;
static struct {
    uintptr_t base;
    uint64_t name;
} g_done[MAX_OBJECTS];
static int g_ndone;
static unsigned long long g_subs = ~0ULL, g_adds = ~0ULL; /* the loader's counts at the last scan */
static uintptr_t g_self_base;
static int g_patching; /* atomic try-lock: the tick and disarm never patch at once (never waited on) */
static uint64_t g_objects_patched, g_slots_skipped;

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001B3ULL;
    return h;
}

static int skip_object(const struct dl_phdr_info *info) {
    const char *n = info->dlpi_name ? info->dlpi_name : "";
    if (info->dlpi_addr == g_self_base && g_self_base != 0)
        return 1;
    static const char *const skipped[] = {"linux-vdso", "linux-gate", "/ld-linux", "ld-linux-", "/libc.so",
                                          "libc.so.", "libc-2.", "/libc-", "libjemalloc", "libtcmalloc",
                                          "libmimalloc", "libhoard", "_csample"};
    if (strncmp(n, "libc.so", 7) == 0)
        return 1;
    for (size_t i = 0; i < sizeof skipped / sizeof skipped[0]; i++)
        if (strstr(n, skipped[i]))
            return 1;
    return 0;
}

static int in_object(const struct dl_phdr_info *info, uintptr_t a) {
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && a >= lo && a < lo + ph->p_memsz)
            return 1;
    }
    return 0;
}

/* Whether the slot's page is one the loader made read-only: PT_GNU_RELRO rounded down at both ends,
 * as ld.so protects it (a last partial page stays writable, and must stay so). */
static int in_relro(const struct dl_phdr_info *info, uintptr_t a, uintptr_t page) {
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = (info->dlpi_addr + ph->p_vaddr) & ~(page - 1);
        uintptr_t hi = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & ~(page - 1);
        if (ph->p_type == PT_GNU_RELRO && a >= lo && a < hi)
            return 1;
    }
    return 0;
}

/* One 8-byte store into a relocation slot, making a RELRO page writable for it. */
static int write_slot(const struct dl_phdr_info *info, uintptr_t slot, uintptr_t value) {
    long page = sysconf(_SC_PAGESIZE);
    int relro = in_relro(info, slot, (uintptr_t)page);
    void *pg = (void *)(slot & ~(uintptr_t)(page - 1));
    if (relro && mprotect(pg, (size_t)page, PROT_READ | PROT_WRITE) != 0)
        return 0;
    __atomic_store_n((uintptr_t *)slot, value, __ATOMIC_SEQ_CST);
    if (relro)
        mprotect(pg, (size_t)page, PROT_READ);
    return 1;
}

static uintptr_t dyn_ptr(const struct dl_phdr_info *info, ElfW(Addr) v) {
    return v < info->dlpi_addr ? info->dlpi_addr + v : v; /* glibc relocates most d_ptr in place */
}

typedef struct {
    int undo;
    int seen;
    int patched;
} ScanCtx;

/* Whether disarm leaves a slot on our hook: free and realloc, once the own heap handed out a block (one may be
 * freed or grown at any time after: glibc must never be given it). */
static int own_keeps(const char *name) {
    return (own.cut != 0 || own.bigs_made != 0) &&
           (strcmp(name, "free") == 0 || strcmp(name, "realloc") == 0 || strcmp(name, "reallocarray") == 0);
}

/* Whether an object's malloc, calloc and realloc slots serve the sampler thread from the own heap (py_malloc):
 * libpython (or the executable it is linked into), numpy's core and our ring writer, whose blocks go back
 * through their own hooked free (or libpython's). */
static int own_serves(const struct dl_phdr_info *info) {
    const char *n = info->dlpi_name;
    return in_object(info, (uintptr_t)&PyMem_RawMalloc) ||
           (n != NULL && (strstr(n, "/numpy/") != NULL || strstr(n, "/blackbox/ring/_cwriter") != NULL));
}

static void patch_relocs(const struct dl_phdr_info *info, const ElfW(Rela) * rel, size_t count,
                         const ElfW(Sym) * symtab, const char *strtab, uint64_t oname, int undo, int *added) {
    int hooks = dlsym_object(info->dlpi_name) ? NHOOKS : NHOOKS - 1;
    int py = own_serves(info);
    for (size_t i = 0; i < count; i++) {
        unsigned long type = ELF64_R_TYPE(rel[i].r_info);
#if defined(__x86_64__)
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
            continue;
#elif defined(__aarch64__)
        if (type != R_AARCH64_JUMP_SLOT && type != R_AARCH64_GLOB_DAT)
            continue;
#else
        (void)type;
        continue;
#endif
        const ElfW(Sym) *sym = &symtab[ELF64_R_SYM(rel[i].r_info)];
        if (sym->st_name == 0 || sym->st_shndx != SHN_UNDEF)
            continue;
        const char *name = strtab + sym->st_name;
        for (int k = 0; k < hooks; k++) {
            if (strcmp(name, g_hooks[k].name) != 0 || *g_hooks[k].real == NULL)
                continue;
            uintptr_t slot = info->dlpi_addr + rel[i].r_offset;
            uintptr_t cur = __atomic_load_n((uintptr_t *)slot, __ATOMIC_RELAXED);
            uintptr_t hook = (uintptr_t)(py && g_hooks[k].py != NULL ? g_hooks[k].py : g_hooks[k].hook);
            if (undo && own_keeps(g_hooks[k].name))
                break;
            if (undo) {
                for (int j = 0; j < g_npatched; j++)
                    if (g_patched[j].slot == slot && g_patched[j].base == info->dlpi_addr && cur == hook)
                        write_slot(info, slot, g_patched[j].orig);
                break;
            }
            if (cur == hook)
                break;
            /* only a slot bound to the global definition, or not bound yet (a lazy PLT stub inside the
             * object): one bound elsewhere (RTLD_DEEPBIND) keeps its own allocator, unhooked */
            if (cur != (uintptr_t)*g_hooks[k].real && !in_object(info, cur)) {
                g_slots_skipped++;
                break;
            }
            if (g_npatched >= MAX_PATCHED)
                break;
            if (write_slot(info, slot, hook)) {
                g_patched[g_npatched++] = (Patched){slot, cur, info->dlpi_addr, oname};
                (*added)++;
            }
            break;
        }
    }
}

static int scan_one(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    ScanCtx *ctx = data;
    if (skip_object(info))
        return 0;
    uint64_t oname = name_hash(info->dlpi_name);
    int known = 0;
    for (int i = 0; i < g_ndone; i++)
        if (g_done[i].base == info->dlpi_addr && g_done[i].name == oname)
            known = 1;
    if (!ctx->undo && known)
        return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (dyn == NULL)
        return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmpsz = 0, relasz = 0;
    long pltrel = DT_RELA;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmpsz = d->d_un.d_val; break;
        case DT_RELA: rela = (const ElfW(Rela) *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = (long)d->d_un.d_val; break;
        default: break;
        }
    }
    if (symtab == NULL || strtab == NULL || pltrel != DT_RELA)
        return 0;
    int added = 0;
    if (jmprel)
        patch_relocs(info, jmprel, jmpsz / sizeof(ElfW(Rela)), symtab, strtab, oname, ctx->undo, &added);
    if (rela)
        patch_relocs(info, rela, relasz / sizeof(ElfW(Rela)), symtab, strtab, oname, ctx->undo, &added);
    if (!ctx->undo && g_ndone < MAX_OBJECTS) {
        g_done[g_ndone].base = info->dlpi_addr;
        g_done[g_ndone].name = oname;
        g_ndone++;
        ctx->seen++;
        if (added) {
            ctx->patched++;
            g_objects_patched++;
        }
    }
    return 0;
}

static int subs_now(struct dl_phdr_info *info, size_t size, void *data) {
    unsigned long long *out = data; /* [adds, subs]: both stay ~0 where this glibc does not count them */
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        out[0] = info->dlpi_adds;
        out[1] = info->dlpi_subs;
    }
    return 1;
}

/* Patch the objects not patched yet (all of them again after an unload: the ones gone are forgotten,
 * since an undo only ever writes into a slot of an object loaded at that moment). Nothing loaded or
 * unloaded since the last scan: nothing to do (the walk of a torch job's 400 objects took 15-20 us a tick). */
static int native_scan(void) {
    int expect = 0;
    if (!__atomic_compare_exchange_n(&g_patching, &expect, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return 0;
    unsigned long long now[2] = {~0ULL, ~0ULL};
    dl_iterate_phdr(subs_now, now);
    if (now[0] != ~0ULL && now[0] == g_adds && now[1] == g_subs) {
        __atomic_store_n(&g_patching, 0, __ATOMIC_RELEASE);
        return 0;
    }
    if (now[1] != g_subs) {
        g_subs = now[1];
        g_ndone = 0;
    }
    g_adds = now[0];
    ScanCtx ctx = {0, 0, 0};
    dl_iterate_phdr(scan_one, &ctx);
    __atomic_store_n(&g_patching, 0, __ATOMIC_RELEASE);
    return ctx.patched;
}

static void native_undo(void) {
    int expect = 0; /* the disarming thread (never a hook) waits for a scan in flight on the tick */
    while (!__atomic_compare_exchange_n(&g_patching, &expect, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        expect = 0;
        sched_yield();
    }
    ScanCtx ctx = {1, 0, 0};
    dl_iterate_phdr(scan_one, &ctx); /* each object's slots restored while the loader cannot unload it */
    g_npatched = 0;
    g_ndone = 0;
    g_subs = g_adds = ~0ULL;
    __atomic_store_n(&g_patching, 0, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------ fork */
static void after_fork_child(void) {
    __atomic_store_n(&g.active, 0, __ATOMIC_SEQ_CST);
    tl.on = 0; /* the tail is the parent's file */
    tl.inflight = 0;
    g.forked = 1;
    g.inflight = 0;
    g_patching = 0;
    tls.own = 0; /* the sampler thread is the parent's (or forked here: then no thread would free what it put
                  * off): a child that arms claims the heap for its own sampler */
    own.owner = 0;
    own.expect = 0;
}

/* ------------------------------------------------------------------ module functions */
static void *anon(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void wait_quiet(void) {
    while (__atomic_load_n(&g.inflight, __ATOMIC_SEQ_CST) != 0)
        sched_yield();
}

static void release_view(void) {
    if (g.have_view) {
        g.have_view = 0;
        PyBuffer_Release(&g.view);
    }
    Py_CLEAR(g.seq_ref);
}

/* start(buffer, records_offset, capacity, sequence, heap_offset, heap_slots, mean_bytes, python, native)
 * -> {"python": bool, "native": bool} */
static PyObject *start(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *buffer, *seq;
    Py_ssize_t roff, hoff;
    unsigned long long cap, slots;
    double mean;
    int want_py, want_native;
    if (!PyArg_ParseTuple(args, "OnKOnKdpp", &buffer, &roff, &cap, &seq, &hoff, &slots, &mean, &want_py,
                          &want_native))
        return NULL;
    if (__atomic_load_n(&g.active, __ATOMIC_SEQ_CST)) {
        PyErr_SetString(PyExc_RuntimeError, "allocation sampling is already started");
        return NULL;
    }
    if (strcmp(Py_TYPE(seq)->tp_name, "blackbox.ring._cwriter.Sequence") != 0) {
        PyErr_SetString(PyExc_TypeError, "sequence must be blackbox.ring._cwriter.Sequence");
        return NULL;
    }
    if (cap == 0 || slots < BUCKET || (slots & (slots - 1)) != 0 || slots > (1ULL << 22) || !(mean >= 1.0) ||
        roff < 0 || hoff < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity > 0, heap slots a power of two (8..4M), mean >= 1 byte");
        return NULL;
    }
    wait_quiet();
    tail_off(); /* until the tick says where (set_tail) */
    release_view();
    if (PyObject_GetBuffer(buffer, &g.view, PyBUF_WRITABLE) < 0)
        return NULL;
    g.have_view = 1;
    if ((unsigned long long)g.view.len < (unsigned long long)roff + cap * RECORD_SIZE ||
        (unsigned long long)g.view.len < (unsigned long long)hoff + slots * HEAP_SLOT) {
        release_view();
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the records or the heap table");
        return NULL;
    }
    if (g.index == NULL || g.index_slots < slots) { /* grows only: an older one stays mapped (a hook may read it) */
        uint64_t *index = anon(slots * 8), *used = anon((slots + 63) / 64 * 8);
        uint32_t *fslot = anon(slots * 4);
        if (index == NULL || used == NULL || fslot == NULL) {
            release_view();
            return PyErr_NoMemory();
        }
        g.index = index;
        g.used = used;
        g.fslot = fslot;
        g.index_slots = slots;
    } else {
        memset(g.index, 0, g.index_slots * 8);
        memset(g.used, 0, (g.index_slots + 63) / 64 * 8);
    }
    g.hint = 0;
    if (g.filter == NULL)
        g.filter = anon(FILTER_SIZE);
    if (g.fbits == NULL)
        g.fbits = anon(FILTER_SIZE / 8);
    if (g.seen == NULL)
        g.seen = anon(SEEN_SLOTS * 8);
    if (g.pending == NULL)
        g.pending = anon(PENDING * sizeof(Pending));
    if (g.filter == NULL || g.fbits == NULL || g.seen == NULL || g.pending == NULL) {
        release_view();
        return PyErr_NoMemory();
    }
    memset(g.filter, 0, FILTER_SIZE);
    memset(g.fbits, 0, FILTER_SIZE / 8);
    memset(g.seen, 0, SEEN_SLOTS * 8);
    for (int i = 0; i < PENDING; i++)
        g.pending[i].state = 0;
    g.queued = 0;
    g.seq_ref = Py_NewRef(seq);
    g.seq = (uint64_t *)((char *)seq + sizeof(PyObject)); /* _cwriter.c: Sequence's first field, the counter */
    g.records = (char *)g.view.buf + roff;
    g.cap = cap;
    g.heap = (char *)g.view.buf + hoff;
    g.slots = slots;
    if (slots % 64) /* a table of fewer than 64 slots: the bits past it are never free */
        g.used[slots / 64] |= ~0ULL << (slots % 64);
    g.buckets = slots / BUCKET;
    __atomic_store(&g.mean, &mean, __ATOMIC_RELAXED);
    g.step = -1;
    g.samples = g.frees = g.table_full = g.stale = g.pending_full = g.seen_full = 0;
    g.forked = 0;
    g.epoch++;
    /* A thread's countdown drawn under an earlier arming with a larger R runs on until it runs out (the fast
     * path never looks at the arming); the arming thread's (the main thread's, mostly) is reset here, so its
     * next allocation draws afresh with this R. */
    tls.countdown = 0;
    int native = 0;
    if (want_native && resolve_reals()) {
        Dl_info self;
        if (dladdr((void *)start, &self))
            g_self_base = (uintptr_t)self.dli_fbase;
        native = 1;
    }
    __atomic_store_n(&g.active, 1, __ATOMIC_SEQ_CST);
    if (want_py)
        py_install();
    if (native)
        native_scan();
    return Py_BuildValue("{sOsO}", "python", want_py ? Py_True : Py_False, "native", native ? Py_True : Py_False);
}

/* stop(in_child): hooks off, allocators and (not in a forked child) slots put back, then (not in a
 * forked child) wait for a slow path in flight on another thread, and release the mapping. */
static PyObject *stop(PyObject *Py_UNUSED(m), PyObject *args) {
    int in_child = 0;
    if (!PyArg_ParseTuple(args, "|p", &in_child))
        return NULL;
    __atomic_store_n(&g.active, 0, __ATOMIC_SEQ_CST);
    if (in_child)
        tl.on = tl.inflight = 0;
    else
        tail_off();
    py_uninstall();
    if (in_child) { /* no dl_iterate_phdr here: a thread of the parent may have held the loader's lock at
                     * the fork. The slots stay patched: our hooks only forward now (and sample again if
                     * this child arms its own ring). */
        g_patching = 0;
        g_npatched = g_ndone = 0;
        g_subs = g_adds = ~0ULL;
    } else {
        native_undo();
    }
    if (!in_child)
        wait_quiet();
    if (OWN_ON() && r_free != NULL) /* what the sampler let go, to glibc now (no other thread may enter a hook) */
        own_other_thread();
    g.inflight = 0;
    release_view();
    Py_RETURN_NONE;
}

static PyObject *rescan(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    if (!__atomic_load_n(&g.active, __ATOMIC_SEQ_CST) || r_malloc == NULL || g_self_base == 0)
        return PyLong_FromLong(0);
    int n;
    Py_BEGIN_ALLOW_THREADS /* the loader's lock may be held by a thread that needs the GIL */
    n = native_scan();
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

static PyObject *set_step(PyObject *Py_UNUSED(m), PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    g.step = n < -1 || n > INT32_MAX ? -1 : n;
    Py_RETURN_NONE;
}

/* set_tail(offset, size, generation): the hooks write new stacks' entries into bytes [offset, offset + size)
 * of the mapping, as entries of that generation (size 0: nowhere). Waits for a hook writing into the old
 * tail, so the caller may then zero it. */
static PyObject *set_tail(PyObject *Py_UNUSED(m), PyObject *args) {
    unsigned long long off, size;
    unsigned int gen;
    if (!PyArg_ParseTuple(args, "KKI", &off, &size, &gen))
        return NULL;
    tail_off();
    if (size == 0)
        Py_RETURN_NONE;
    if (!g.have_view || off + size > (unsigned long long)g.view.len || size < 4096 || size % 8 || off % 8 || gen == 0) {
        PyErr_SetString(PyExc_ValueError, "the tail must lie in the mapping, 8-byte aligned, at least 4096 bytes");
        return NULL;
    }
    tl.base = (char *)g.view.buf + off;
    tl.size = size;
    tl.gen = gen;
    tl.cursor = 0;
    tl.next_id = 0; /* (the tail is zero: a new ring's, or a half the table zeroed as it turned over) */
    __atomic_store_n(&tl.on, 1, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* name_threads([(ident, name bytes)]): the names the hooks write with a new stack (the tick gives every live
 * thread's; a name longer than NAME_BYTES - 1 bytes is cut). */
static PyObject *name_threads(PyObject *Py_UNUSED(m), PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "name_threads takes a sequence of (ident, name bytes)");
    if (seq == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
        unsigned long long ident;
        const char *name;
        Py_ssize_t len;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "Ky#", &ident, &name, &len)) {
            Py_DECREF(seq);
            return NULL;
        }
        uint64_t i = mix64(ident) % NAMES, free_at = NAMES;
        for (int k = 0; k < 8; k++, i = (i + 1) % NAMES) {
            uint64_t t = __atomic_load_n(&g_names[i].thread, __ATOMIC_ACQUIRE);
            if (t == ident || t == 0) {
                free_at = i;
                break;
            }
        }
        if (free_at == NAMES) /* its neighbourhood full: take the first slot of it */
            free_at = mix64(ident) % NAMES;
        ThreadName *e = &g_names[free_at];
        __atomic_store_n(&e->thread, 0, __ATOMIC_RELEASE);
        memset(e->name, 0, NAME_BYTES);
        memcpy(e->name, name, (size_t)(len < NAME_BYTES - 1 ? len : NAME_BYTES - 1));
        __atomic_store_n(&e->thread, (uint64_t)ident, __ATOMIC_RELEASE);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* set_mean(R): countdowns drawn from now on have mean R bytes (the tick raises it where a job allocates so
 * fast that sampling would cost too much); each block keeps the weight of the probability it was sampled
 * with, so estimates stay unbiased across the change. */
static PyObject *set_mean(PyObject *Py_UNUSED(m), PyObject *arg) {
    double mean = PyFloat_AsDouble(arg);
    if (mean == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(mean >= 1.0) || mean > 1e15) {
        PyErr_SetString(PyExc_ValueError, "mean bytes must be >= 1 and <= 1e15");
        return NULL;
    }
    __atomic_store(&g.mean, &mean, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

/* own_heap(bytes) -> bool: the sampler thread's own heap (_own_heap.h) mapped, where malloc is glibc's and the
 * hooks are in; False where not (another allocator makes no per-thread arena of 64 MiB). */
static PyObject *own_heap(PyObject *Py_UNUSED(m), PyObject *arg) {
    Py_ssize_t bytes = PyLong_AsSsize_t(arg);
    if (bytes < 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "own heap bytes must be >= 0");
    if (r_malloc == NULL || g_npatched == 0)
        Py_RETURN_FALSE;
    Dl_info where;
    if (!dladdr((void *)r_malloc, &where) || where.dli_fname == NULL || strstr(where.dli_fname, "libc.so") == NULL)
        Py_RETURN_FALSE;
    if (r_usable == NULL)
        r_usable = (size_t(*)(void *))dlsym(RTLD_DEFAULT, "malloc_usable_size");
    if (r_usable == NULL || bytes < (Py_ssize_t)OWN_MAX_BLOCK)
        Py_RETURN_FALSE;
    return PyBool_FromLong(own_start((size_t)bytes));
}

/* own_claim() -> bool: the calling thread serves its allocations from the own heap (the sampler, first thing). */
static PyObject *own_heap_claim(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    return PyBool_FromLong(own_claim());
}

static PyObject *own_heap_release(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    own_release();
    Py_RETURN_NONE;
}

/* own_heap_expect(bool): a thread about to start will claim the own heap (see own_defers). */
static PyObject *own_heap_expect(PyObject *Py_UNUSED(m), PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    __atomic_store_n(&own.expect, own.size != 0 && on, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* list_dir(path) -> [names]: a directory's entries but . and .., by getdents64 into a buffer on the stack: the
 * sampler thread lists /proc/self/task without opendir, whose malloc would give it a glibc arena. */
static PyObject *list_dir(PyObject *Py_UNUSED(m), PyObject *arg) {
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    int fd = open(PyBytes_AS_STRING(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    Py_DECREF(path);
    if (fd < 0)
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
    PyObject *out = PyList_New(0);
    char buf[4096] __attribute__((aligned(8)));
    for (;;) {
        long n = out == NULL ? 0 : syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n <= 0) {
            if (n < 0) {
                Py_CLEAR(out);
                PyErr_SetFromErrno(PyExc_OSError);
            }
            break;
        }
        for (long at = 0; at < n;) {
            const struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *d = (const void *)(buf + at);
            at += d->reclen;
            if (strcmp(d->name, ".") == 0 || strcmp(d->name, "..") == 0)
                continue;
            PyObject *name = PyUnicode_DecodeFSDefault(d->name);
            if (name == NULL || PyList_Append(out, name) < 0) {
                Py_XDECREF(name);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(name);
        }
    }
    close(fd);
    return out;
}

static PyObject *ignore_thread(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    tls.nosample = 1;
    Py_RETURN_NONE;
}

/* queued() -> how many stacks seen for the first time wait for pending() (at most a tick late: a hook counts
 * its entry just after marking it ready). A steady tick reads this alone: the 64 entries lie 16 KiB apart. */
static PyObject *queued(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    int64_t n = __atomic_load_n(&g.queued, __ATOMIC_ACQUIRE);
    return PyLong_FromLongLong(n > 0 ? n : 0);
}

/* pending() -> [(fingerprint, thread, depth, [frame text bytes, innermost first])] ready for the table. */
static PyObject *pending(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    PyObject *out = PyList_New(0);
    if (out == NULL || g.pending == NULL)
        return out;
    for (int i = 0; i < PENDING; i++) {
        Pending *e = &g.pending[i];
        if (__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) != 2)
            continue;
        PyObject *frames = PyList_New(e->nframes);
        if (frames == NULL)
            goto fail;
        for (uint32_t k = 0; k < e->nframes; k++) {
            PyObject *b = PyBytes_FromStringAndSize(e->text + e->off[k], e->off[k + 1] - e->off[k]);
            if (b == NULL) {
                Py_DECREF(frames);
                goto fail;
            }
            PyList_SET_ITEM(frames, k, b);
        }
        PyObject *item = Py_BuildValue("(KKIN)", (unsigned long long)e->hash, (unsigned long long)e->thread,
                                       e->depth, frames);
        __atomic_store_n(&e->state, 0, __ATOMIC_RELEASE);
        __atomic_sub_fetch(&g.queued, 1, __ATOMIC_RELEASE);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* live_stacks() -> {fingerprint: sampled blocks} of the blocks in the heap table now. */
static PyObject *live_stacks(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    PyObject *out = PyDict_New();
    if (out == NULL || !__atomic_load_n(&g.active, __ATOMIC_SEQ_CST))
        return out;
    for (uint64_t j = 0; j < g.slots; j++) {
        uint64_t *s = (uint64_t *)(g.heap + j * HEAP_SLOT);
        if (__atomic_load_n(&s[0], __ATOMIC_ACQUIRE) == 0)
            continue;
        PyObject *key = PyLong_FromUnsignedLongLong(s[3]);
        PyObject *old = key ? PyDict_GetItemWithError(out, key) : NULL;
        PyObject *n = key && !PyErr_Occurred() ? PyLong_FromLong(old ? PyLong_AsLong(old) + 1 : 1) : NULL;
        if (n == NULL || PyDict_SetItem(out, key, n) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(n);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(n);
    }
    return out;
}

/* track(address, size, weight, fingerprint, device[, when]) -> slot or -1: a GPU block sampled by the tick
 * (from the allocator's history) into the heap table, with its alloc_sample record. ``when``: the block's
 * allocation (CLOCK_MONOTONIC ns, from the history's own time), kept in its slot where it is not later than
 * now; else the slot holds now, the drain's time. */
static PyObject *track(PyObject *Py_UNUSED(m), PyObject *args) {
    unsigned long long addr, size, weight, stack;
    int device;
    long long when = 0;
    if (!PyArg_ParseTuple(args, "KKKKi|L", &addr, &size, &weight, &stack, &device, &when))
        return NULL;
    if (!__atomic_load_n(&g.active, __ATOMIC_SEQ_CST) || addr <= BUSY || addr >= (1ULL << 55) || device < 0 ||
        device > 255)
        return PyLong_FromLongLong(-1);
    uint64_t key = addr | GPU_KEY | (uint64_t)device << 55;
    int64_t t = now_ns();
    tls.guard++;
    int64_t slot = -1, entry = heap_claim(key, addr_hash((void *)(uintptr_t)key), &slot);
    if (entry >= 0)
        heap_fill(entry, slot, key, addr, size, weight, stack, when > 0 && when < t ? when : t, DOMAIN_GPU);
    else
        g.table_full++;
    int64_t payload[PAYLOAD_WORDS] = {(int64_t)addr, (int64_t)weight, (int64_t)stack, DOMAIN_GPU, slot, 0, 0, 0, 0};
    put_record(KIND_ALLOC_SAMPLE, (int64_t)size, payload, device);
    tls.guard--;
    return PyLong_FromLongLong(slot);
}

/* untrack(address, device) -> True if it was a tracked GPU block (its free_sample record written). */
static PyObject *untrack(PyObject *Py_UNUSED(m), PyObject *args) {
    unsigned long long addr;
    int device;
    if (!PyArg_ParseTuple(args, "Ki", &addr, &device))
        return NULL;
    if (!__atomic_load_n(&g.active, __ATOMIC_SEQ_CST) || addr <= BUSY || addr >= (1ULL << 55) || device < 0 ||
        device > 255)
        Py_RETURN_FALSE;
    void *key = (void *)(uintptr_t)(addr | GPU_KEY | (uint64_t)device << 55);
    if (!tracked(key))
        Py_RETURN_FALSE;
    uint64_t before = g.frees;
    on_free(key);
    return PyBool_FromLong(g.frees != before);
}

static PyObject *stats(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsisKsKsKsKsKsKsKsKsK}", "samples", (unsigned long long)g.samples, "frees",
                         (unsigned long long)g.frees, "table_full", (unsigned long long)g.table_full, "stale",
                         (unsigned long long)g.stale, "pending_full", (unsigned long long)g.pending_full,
                         "seen_full", (unsigned long long)g.seen_full, "objects_patched",
                         (unsigned long long)g_objects_patched, "slots_skipped", (unsigned long long)g_slots_skipped,
                         "slots_patched", g_npatched, "tail_written", (unsigned long long)tl.written, "tail_dropped",
                         (unsigned long long)tl.dropped, "own_bytes", (unsigned long long)own.size, "own_cut",
                         (unsigned long long)own.cut, "own_in_use", (unsigned long long)(own.in_use + own.big_in_use), "own_high",
                         (unsigned long long)own.high, "own_fallbacks", (unsigned long long)own.fallbacks,
                         "own_deferred_frees", (unsigned long long)own.deferred_frees, "own_bigs_made",
                         (unsigned long long)own.bigs_made);
}

static PyMethodDef methods[] = {
    {"start", start, METH_VARARGS,
     "start(buffer, records_offset, capacity, sequence, heap_offset, heap_slots, mean_bytes, python, native)."},
    {"stop", stop, METH_VARARGS, "stop(in_child=False): hooks off and put back; the mapping released."},
    {"rescan", rescan, METH_NOARGS, "Patch shared objects loaded since the last scan; how many."},
    {"set_step", set_step, METH_O, "The step in force, for the heap table's slots."},
    {"ignore_thread", ignore_thread, METH_NOARGS, "Never sample the calling thread's allocations."},
    {"own_heap", own_heap, METH_O, "own_heap(bytes) -> bool: the sampler thread's own heap, where malloc is glibc's."},
    {"own_heap_claim", own_heap_claim, METH_NOARGS, "The calling thread allocates from the own heap."},
    {"own_heap_release", own_heap_release, METH_NOARGS, "The calling thread no longer owns the own heap."},
    {"own_heap_expect", own_heap_expect, METH_O, "own_heap_expect(bool): a thread about to start will claim it."},
    {"list_dir", list_dir, METH_O, "list_dir(path) -> [names]: entries but . and .., with no malloc in libc."},
    {"set_tail", set_tail, METH_VARARGS, "set_tail(offset, size, generation): where hooks write new stacks."},
    {"name_threads", name_threads, METH_O, "name_threads([(ident, name bytes)]): threads' names for the hooks."},
    {"set_mean", set_mean, METH_O, "set_mean(R): the mean sampling interval, bytes, for countdowns drawn from now."},
    {"queued", queued, METH_NOARGS, "How many stacks seen for the first time pending() would return."},
    {"pending", pending, METH_NOARGS, "Stacks seen for the first time: (fingerprint, thread, depth, frames)."},
    {"live_stacks", live_stacks, METH_NOARGS, "{fingerprint: blocks} in the heap table now."},
    {"track", track, METH_VARARGS, "track(address, size, weight, fingerprint, device[, when]) -> heap slot or -1."},
    {"untrack", untrack, METH_VARARGS, "untrack(address, device) -> whether it was a tracked GPU block."},
    {"stats", stats, METH_NOARGS, "Counters since start."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "blackbox.collect._csample",
                                    "Allocations sampled by bytes (see collect/allocs.py).", -1, methods};

PyMODINIT_FUNC PyInit__csample(void) {
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, after_fork_child) == 0)
        atfork_done = 1;
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "HEAP_SLOT", HEAP_SLOT) < 0 || PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0)
        return NULL;
    return m;
}
