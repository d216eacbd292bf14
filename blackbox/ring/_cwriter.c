/* blackbox.ring._cwriter: the write path and the signal recorder in C (optional).
 *
 * writer.py falls back to Python where this is not built; then events are still
 * recorded, signals are not (nothing is installed over the job's signals).
 *
 * 1. Sequence: the ring's one seq counter, an atomic fetch-add. Both write paths
 *    take every seq from it, and so does the signal handler below, which can run
 *    on any thread at any instruction: two writers never get the same slot.
 *
 * 2. Writer: the same bytes as the Python path (FORMAT.md, "Record slots";
 *    tests/test_writer_backends.py compares them byte for byte). Every argument
 *    is converted first (that can run Python code: __index__, __hash__, the
 *    intern callable, and so let another thread disarm); only then is the writer
 *    checked alive, and the seq, the clock read and the slot written with no
 *    Python call in between, under the GIL.
 *
 *    Commit rule: the seq word is stored first, then the other fields, then the
 *    commit word (a release store). A process killed at any instruction leaves
 *    commit != seq in a slot it was writing.
 *
 * 3. The signal recorder: an async-signal-safe sigaction handler over the job's
 *    own disposition (never over SIG_IGN). It writes one `signal` record with ids
 *    interned at arm (no interning, no lock, no Python, no allocation), then
 *    hands the signal on: to the disposition it wrapped (the job's C or Python
 *    handler, with the same siginfo), or, for SIG_DFL, it restores SIG_DFL and
 *    raises the signal again so the process ends at once, exactly as it would
 *    have (except where the process is, or stands in for, a PID namespace's
 *    first process, to which the kernel gives no such signal: signals_stand_in).
 *    Python's own handler table is never touched: signal.getsignal()
 *    answers what it would without blackbox. A second signal re-enters it
 *    safely: every step is a syscall or an atomic.
 *
 * 4. The write window: the ring is mapped whole, but only the chunk being written
 *    stays in this process's page tables. Whoever takes the seq of a chunk's
 *    first slot (either write path or the signal handler) unmaps the previous
 *    chunk with madvise(MADV_DONTNEED). On a MAP_SHARED file mapping that only
 *    zaps page-table entries: the written bytes stay in the page cache, which is
 *    the file, so they survive SIGKILL as before, and the next lap's writes fault
 *    the pages back in (minor faults: file.py fills the page cache at creation).
 *    So the ring's pages do not count in this process's RSS, nor in the kernel
 *    OOM killer's choice of victim (oom_badness counts get_mm_rss). One syscall
 *    per chunk, no lock (the kernel's own mmap lock, as a page fault takes it).
 *
 * 5. Forward: what ``blackbox.mark`` and ``blackbox.step`` are while no ring is
 *    armed (and what a reference taken before arm() keeps): a call hands its
 *    arguments on to the armed writer's function, or, with none, returns None
 *    at once. Library code marks whether or not the job is armed, so the call
 *    that records nothing costs one C call, not two Python frames.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the C write path assumes a little-endian host; the Python path is used elsewhere"
#endif

#define RECORD_SIZE 128
#define PAYLOAD_WORDS 9
#define FLAG_VALUE 1
#define MAX_SIGNAL 65

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* what time.monotonic_ns() reads on Linux; async-signal-safe */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One record into slot seq % cap: seq first, commit last (FORMAT.md, "The commit rule"). */
static inline void put_record(char *records, uint64_t cap, uint64_t seq, int64_t t, uint64_t thread, int64_t step,
                              int64_t value, uint64_t tag, const int64_t *payload) {
    uint64_t *q = (uint64_t *)(records + (seq % cap) * RECORD_SIZE);
    __atomic_store_n(&q[0], seq, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    q[1] = (uint64_t)t;
    q[2] = thread;
    q[3] = (uint64_t)step;
    q[4] = (uint64_t)value;
    q[5] = tag;
    if (payload)
        memcpy(&q[6], payload, PAYLOAD_WORDS * 8);
    else
        memset(&q[6], 0, PAYLOAD_WORDS * 8);
    __atomic_store_n(&q[15], seq, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------ Sequence */
static int g_inflight; /* atomic: signal handlers inside the signal target (see "signals" below) */

typedef struct {
    PyObject_HEAD
    uint64_t value; /* the last seq handed out */
    /* The write window (see 4. above). records is the on switch: set last (release), cleared first. */
    char *records;
    uint64_t cap;
    uint64_t chunk;   /* slots per chunk: a power of two, a whole number of pages */
    int cap_chunked;  /* cap is a multiple of chunk: seq's place in its chunk is seq & (chunk - 1) */
    pid_t pid;        /* the process that set the window (a forked child's copy never waits on it) */
    Py_buffer view;   /* keeps the mapping from being unmapped while the window is on */
    int have_view;
} Sequence;

/* Record seq is the first of its chunk: unmap the previous chunk's pages. */
static void window_cross(Sequence *s, char *records, uint64_t seq) {
    uint64_t cap = s->cap, chunk = s->chunk, slot = seq % cap;
    uint64_t prev = slot ? slot - chunk : (cap - 1) / chunk * chunk;
    if (prev != slot) {
        uint64_t n = cap - prev < chunk ? cap - prev : chunk;
        madvise(records + prev * RECORD_SIZE, n * RECORD_SIZE, MADV_DONTNEED);
    }
}

/* After record seq is written (or, on the Python path, just before): at a chunk's first slot, move
 * the window. An error is ignored: a page left mapped costs RSS, never data. Async-signal-safe: an
 * atomic load and, once a chunk, one syscall. */
static inline void window_after(Sequence *s, uint64_t seq) {
    char *records = __atomic_load_n(&s->records, __ATOMIC_ACQUIRE);
    if (records == NULL)
        return;
    uint64_t place = s->cap_chunked ? seq : seq % s->cap;
    if ((place & (s->chunk - 1)) == 0)
        window_cross(s, records, seq);
}

static PyObject *Sequence_next(Sequence *s) {
    uint64_t seq = __atomic_add_fetch(&s->value, 1, __ATOMIC_RELAXED);
    /* The Python write path takes its seq here and writes the slot just after, in the same C-level
     * call: the window moves a record early, which changes nothing but which call pays for it. */
    window_after(s, seq);
    return PyLong_FromUnsignedLongLong(seq);
}

static PyObject *Sequence_get_value(Sequence *s, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&s->value, __ATOMIC_RELAXED));
}

/* Stop moving the window; wait for a handler of this process that may be moving it (a few
 * syscalls), then let go of the buffer. */
static void window_stop(Sequence *s) {
    __atomic_store_n(&s->records, NULL, __ATOMIC_SEQ_CST);
    if (s->pid == getpid())
        while (__atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) != 0)
            sched_yield();
    if (s->have_view) {
        s->have_view = 0;
        PyBuffer_Release(&s->view);
    }
}

/* window(buffer, records_offset, capacity, chunk_slots): keep only the chunk being written mapped. */
static PyObject *Sequence_window(Sequence *s, PyObject *args) {
    PyObject *buffer;
    Py_ssize_t offset;
    unsigned long long cap, chunk;
    if (!PyArg_ParseTuple(args, "OnKK", &buffer, &offset, &cap, &chunk))
        return NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || chunk == 0 || (chunk & (chunk - 1)) != 0 || (chunk * RECORD_SIZE) % (unsigned long)page != 0 ||
        cap == 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_slots must be a power of two of whole pages, capacity > 0");
        return NULL;
    }
    window_stop(s);
    if (PyObject_GetBuffer(buffer, &s->view, PyBUF_WRITABLE) < 0)
        return NULL;
    s->have_view = 1;
    char *records = (char *)s->view.buf + offset;
    if (s->view.len < offset || (unsigned long long)(s->view.len - offset) / RECORD_SIZE < cap ||
        ((uintptr_t)records % (uintptr_t)page) != 0) {
        window_stop(s);
        PyErr_SetString(PyExc_ValueError, "buffer too small or record region not page-aligned");
        return NULL;
    }
    s->cap = cap;
    s->chunk = chunk;
    s->cap_chunked = cap % chunk == 0;
    s->pid = getpid();
    __atomic_store_n(&s->records, records, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *Sequence_close_window(Sequence *s, PyObject *Py_UNUSED(ignored)) {
    window_stop(s);
    Py_RETURN_NONE;
}

/* trim(): drop every record page but the current chunk's (the sampler's tick: pages a late writer
 * faulted back in behind the window). The GIL is held throughout: no write path moves meanwhile. */
static PyObject *Sequence_trim(Sequence *s, PyObject *Py_UNUSED(ignored)) {
    char *records = __atomic_load_n(&s->records, __ATOMIC_ACQUIRE);
    if (records != NULL) {
        uint64_t cap = s->cap, chunk = s->chunk;
        uint64_t head = __atomic_load_n(&s->value, __ATOMIC_RELAXED) % cap / chunk * chunk;
        uint64_t end = head + chunk < cap ? head + chunk : cap;
        if (head > 0)
            madvise(records, head * RECORD_SIZE, MADV_DONTNEED);
        if (end < cap)
            madvise(records + end * RECORD_SIZE, (cap - end) * RECORD_SIZE, MADV_DONTNEED);
    }
    return PyBool_FromLong(records != NULL);
}

static void Sequence_dealloc(Sequence *s) {
    window_stop(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef Sequence_methods[] = {
    {"window", (PyCFunction)Sequence_window, METH_VARARGS,
     "window(buffer, records_offset, capacity, chunk_slots): keep only the chunk being written mapped."},
    {"close_window", (PyCFunction)Sequence_close_window, METH_NOARGS, "Stop moving the window; release the buffer."},
    {"trim", (PyCFunction)Sequence_trim, METH_NOARGS,
     "Drop every record page but the current chunk's; False when no window is set."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Sequence_getset[] = {
    {"value", (getter)Sequence_get_value, NULL, "The last seq handed out (0: none yet).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SequenceType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "blackbox.ring._cwriter.Sequence",
    .tp_basicsize = sizeof(Sequence),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The ring's seq counter: next() is one atomic fetch-add (safe from signal handlers).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Sequence_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Sequence_next,
    .tp_methods = Sequence_methods,
    .tp_getset = Sequence_getset,
};

/* ------------------------------------------------------------------ Writer */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int have_view;
    char *records;
    uint64_t cap;
    Sequence *seq;
    int64_t step; /* the step in force, -1 before the first */
    PyObject *ids;      /* dict: label -> int id, shared with the Python intern */
    PyObject *intern;   /* callable(label) -> int id */
    PyObject *on_error; /* callable(exception) */
    uint64_t mark_tag, mark_value_tag, step_tag, sample_tag;
    int dead;
} Writer;

static inline void write_now(Writer *w, int64_t step, int64_t value, uint64_t tag, const int64_t *payload,
                             int64_t *t_out) {
    uint64_t seq = __atomic_add_fetch(&w->seq->value, 1, __ATOMIC_RELAXED);
    int64_t t = now_ns();
    put_record(w->records, w->cap, seq, t, (uint64_t)PyThread_get_thread_ident(), step, value, tag, payload);
    window_after(w->seq, seq);
    if (t_out)
        *t_out = t;
}

/* The job's exception test (blackbox._jobsignal.raised_by_signal_handler, set by writer.py): an
 * exception it answers True for was raised by the job's own signal handler while we ran Python code. */
static PyObject *g_job_exception;

/* Report the pending exception through on_error (once the writer is dead, drop it). Only an
 * Exception: a KeyboardInterrupt or SystemExit raised by the job's signal handler while we ran
 * Python code (the intern callable, __index__) propagates to the job, as it would without us, and
 * so does any exception the job's test names as raised by its signal handler. */
static PyObject *report(Writer *w) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    if (g_job_exception != NULL && value != NULL) {
        PyObject *answer = PyObject_CallOneArg(g_job_exception, value);
        if (answer == NULL) { /* the test itself raised: the job's handler again, it propagates */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
        int jobs = PyObject_IsTrue(answer);
        Py_DECREF(answer);
        if (jobs > 0) {
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        PyErr_Clear();
    }
    if (!w->dead && w->on_error != NULL) {
        PyObject *r = PyObject_CallOneArg(w->on_error, value ? value : Py_None);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    Py_RETURN_NONE;
}

/* The label's id: 0 for None, else from the dict or the Python intern. -1 on error. */
static int64_t label_id(Writer *w, PyObject *label) {
    if (label == Py_None)
        return 0;
    PyObject *id = PyDict_GetItemWithError(w->ids, label); /* borrowed */
    if (id != NULL)
        return PyLong_AsLongLong(id);
    if (PyErr_Occurred())
        return -1;
    PyObject *r = PyObject_CallOneArg(w->intern, label);
    if (r == NULL)
        return -1;
    int64_t v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

/* value -> int64; returns -1 on error. */
static int int_value(PyObject *obj, int64_t *out) {
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL)
        return -1;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "value does not fit in int64");
        return -1;
    }
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Up to 9 payload words from a sequence; words it does not give are -1 (not measured). */
static int payload_words(PyObject *obj, int64_t *payload, int exact) {
    PyObject *seq = PySequence_Fast(obj, "payload must be a sequence of ints");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PAYLOAD_WORDS || (exact && n != PAYLOAD_WORDS)) {
        PyErr_Format(PyExc_ValueError, "payload must hold %s%d ints, got %zd", exact ? "" : "at most ",
                     PAYLOAD_WORDS, n);
        Py_DECREF(seq);
        return -1;
    }
    for (int i = 0; i < PAYLOAD_WORDS; i++) {
        payload[i] = -1;
        if (i < n && int_value(PySequence_Fast_GET_ITEM(seq, i), &payload[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* Positional-or-keyword parsing, no allocations. */
static int parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names, int nparams,
                 int required, PyObject **out) {
    if (nargs > nparams) {
        PyErr_Format(PyExc_TypeError, "takes at most %d arguments (%zd given)", nparams, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            int found = 0;
            for (int p = 0; p < nparams; p++) {
                if (PyUnicode_CompareWithASCIIString(key, names[p]) == 0) {
                    if (out[p] != NULL) {
                        PyErr_Format(PyExc_TypeError, "got multiple values for argument '%s'", names[p]);
                        return -1;
                    }
                    out[p] = args[nargs + k];
                    found = 1;
                    break;
                }
            }
            if (!found) {
                PyErr_Format(PyExc_TypeError, "got an unexpected keyword argument '%U'", key);
                return -1;
            }
        }
    }
    for (int p = 0; p < required; p++) {
        if (out[p] == NULL) {
            PyErr_Format(PyExc_TypeError, "missing required argument '%s'", names[p]);
            return -1;
        }
    }
    return 0;
}

static const char *const MARK_NAMES[] = {"label", "value"};
static const char *const STEP_NAMES[] = {"n"};
static const char *const EVENT_NAMES[] = {"kind", "label", "value", "device", "payload"};
static const char *const SAMPLE_NAMES[] = {"payload", "device"};

static PyObject *Writer_mark(Writer *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->dead)
        Py_RETURN_NONE;
    PyObject *a[2] = {NULL, NULL};
    if (nargs >= 1 && kwnames == NULL && nargs <= 2) {
        a[0] = args[0];
        if (nargs == 2)
            a[1] = args[1];
    } else if (parse(args, nargs, kwnames, MARK_NAMES, 2, 1, a) < 0) {
        return report(w);
    }
    int64_t value = 0;
    uint64_t tag = w->mark_tag;
    if (a[1] != NULL && a[1] != Py_None) {
        if (int_value(a[1], &value) < 0)
            return report(w);
        tag = w->mark_value_tag;
    }
    int64_t lid = label_id(w, a[0]);
    if (lid < 0)
        return report(w);
    if (w->dead) /* the conversions ran Python code: another thread may have disarmed meanwhile */
        Py_RETURN_NONE;
    write_now(w, w->step, value, (uint64_t)lid | tag, NULL, NULL);
    Py_RETURN_NONE;
}

static PyObject *Writer_step(Writer *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->dead)
        Py_RETURN_NONE;
    PyObject *a[1] = {NULL};
    if (parse(args, nargs, kwnames, STEP_NAMES, 1, 0, a) < 0)
        return report(w);
    int have = 0;
    int64_t n = 0;
    if (a[0] != NULL && a[0] != Py_None) {
        if (int_value(a[0], &n) < 0)
            return report(w);
        if (n < 0) {
            PyErr_Format(PyExc_ValueError, "step must be >= 0, got %lld", (long long)n);
            return report(w);
        }
        have = 1;
    }
    if (w->dead)
        Py_RETURN_NONE;
    if (!have)
        n = w->step + 1;
    w->step = n;
    write_now(w, n, n, w->step_tag, NULL, NULL);
    Py_RETURN_NONE;
}

static PyObject *Writer_event(Writer *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->dead)
        return PyLong_FromLong(0);
    PyObject *a[5] = {NULL, NULL, NULL, NULL, NULL};
    int64_t kind, value = 0, device = -1, lid = 0, payload[PAYLOAD_WORDS], t = 0;
    uint64_t flags = 0;
    int have_payload = 0;
    if (parse(args, nargs, kwnames, EVENT_NAMES, 5, 1, a) < 0 || int_value(a[0], &kind) < 0)
        goto fail;
    if (a[4] != NULL && a[4] != Py_None) {
        if (payload_words(a[4], payload, 0) < 0)
            goto fail;
        have_payload = 1;
    }
    if (a[3] != NULL && int_value(a[3], &device) < 0)
        goto fail;
    if (kind < 0 || kind > 255 || device < -32768 || device > 32767) {
        PyErr_Format(PyExc_ValueError, "kind %lld or device %lld out of range", (long long)kind, (long long)device);
        goto fail;
    }
    if (a[2] != NULL && a[2] != Py_None) {
        if (int_value(a[2], &value) < 0)
            goto fail;
        flags = FLAG_VALUE;
    }
    if (a[1] != NULL && (lid = label_id(w, a[1])) < 0)
        goto fail;
    if (w->dead)
        return PyLong_FromLong(0);
    uint64_t tag = (uint64_t)lid | (uint64_t)kind << 32 | flags << 40 | ((uint64_t)device & 0xFFFF) << 48;
    write_now(w, w->step, value, tag, have_payload ? payload : NULL, &t);
    return PyLong_FromLongLong(t);
fail: {
    PyObject *r = report(w);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    return PyLong_FromLong(0);
}
}

static PyObject *Writer_sample(Writer *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->dead)
        Py_RETURN_NONE;
    PyObject *a[2] = {NULL, NULL};
    int64_t payload[PAYLOAD_WORDS], device = -1;
    if (parse(args, nargs, kwnames, SAMPLE_NAMES, 2, 1, a) < 0)
        return report(w);
    if (a[1] != NULL && int_value(a[1], &device) < 0)
        return report(w);
    if (payload_words(a[0], payload, 1) < 0)
        return report(w);
    if (w->dead)
        Py_RETURN_NONE;
    write_now(w, w->step, 0, w->sample_tag | ((uint64_t)device & 0xFFFF) << 48, payload, NULL);
    Py_RETURN_NONE;
}

static PyObject *Writer_current_step(Writer *w, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(w->step);
}

static void release(Writer *w) {
    w->dead = 1;
    w->records = NULL;
    if (w->have_view) {
        w->have_view = 0;
        PyBuffer_Release(&w->view);
    }
}

static PyObject *Writer_kill(Writer *w, PyObject *Py_UNUSED(ignored)) {
    release(w);
    Py_RETURN_NONE;
}

static int Writer_init(Writer *w, PyObject *args, PyObject *kwds) {
    PyObject *buffer, *ids, *intern, *on_error, *seq;
    Py_ssize_t offset;
    unsigned long long cap, mark_tag, mark_value_tag, step_tag, sample_tag;
    static char *kwlist[] = {"buffer",   "records_offset", "capacity",       "sequence", "ids",        "intern",
                             "on_error", "mark_tag",       "mark_value_tag", "step_tag", "sample_tag", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnKO!O!OOKKKK", kwlist, &buffer, &offset, &cap, &SequenceType,
                                     &seq, &PyDict_Type, &ids, &intern, &on_error, &mark_tag, &mark_value_tag,
                                     &step_tag, &sample_tag))
        return -1;
    if (w->have_view) {
        PyErr_SetString(PyExc_RuntimeError, "Writer already initialised");
        return -1;
    }
    if (cap == 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity must be > 0 and records_offset >= 0");
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &w->view, PyBUF_WRITABLE) < 0)
        return -1;
    w->have_view = 1;
    if (w->view.len < offset || (unsigned long long)(w->view.len - offset) / RECORD_SIZE < cap ||
        ((uintptr_t)((char *)w->view.buf + offset) & 7) != 0) {
        release(w);
        PyErr_SetString(PyExc_ValueError, "buffer too small or record region not 8-byte aligned");
        return -1;
    }
    w->dead = 0;
    w->records = (char *)w->view.buf + offset;
    w->cap = cap;
    w->step = -1;
    Py_XSETREF(w->seq, (Sequence *)Py_NewRef(seq));
    Py_XSETREF(w->ids, Py_NewRef(ids));
    Py_XSETREF(w->intern, Py_NewRef(intern));
    Py_XSETREF(w->on_error, Py_NewRef(on_error));
    w->mark_tag = mark_tag;
    w->mark_value_tag = mark_value_tag;
    w->step_tag = step_tag;
    w->sample_tag = sample_tag;
    return 0;
}

static int Writer_traverse(Writer *w, visitproc visit, void *arg) {
    Py_VISIT(w->seq);
    Py_VISIT(w->ids);
    Py_VISIT(w->intern);
    Py_VISIT(w->on_error);
    return 0;
}

static int Writer_clear(Writer *w) {
    Py_CLEAR(w->seq);
    Py_CLEAR(w->ids);
    Py_CLEAR(w->intern);
    Py_CLEAR(w->on_error);
    return 0;
}

static void Writer_dealloc(Writer *w) {
    PyObject_GC_UnTrack(w);
    release(w);
    Writer_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef Writer_methods[] = {
    {"mark", (PyCFunction)(void (*)(void))Writer_mark, METH_FASTCALL | METH_KEYWORDS,
     "mark(label, value=None): record a mark event."},
    {"step", (PyCFunction)(void (*)(void))Writer_step, METH_FASTCALL | METH_KEYWORDS,
     "step(n=None): start step n (the next step when None)."},
    {"event", (PyCFunction)(void (*)(void))Writer_event, METH_FASTCALL | METH_KEYWORDS,
     "event(kind, label=None, value=None, device=-1, payload=None) -> monotonic ns (0 if dropped)."},
    {"sample", (PyCFunction)(void (*)(void))Writer_sample, METH_FASTCALL | METH_KEYWORDS,
     "sample(payload, device=-1): record a sample; payload is 9 int64 gauges."},
    {"current_step", (PyCFunction)Writer_current_step, METH_NOARGS, "The step in force (-1 before the first)."},
    {"kill", (PyCFunction)Writer_kill, METH_NOARGS, "Stop writing and release the buffer."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "blackbox.ring._cwriter.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Write path of one mapped ring (see blackbox/ring/writer.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_traverse = (traverseproc)Writer_traverse,
    .tp_clear = (inquiry)Writer_clear,
    .tp_methods = Writer_methods,
};

/* ------------------------------------------------------------------ Forward (5.) */
typedef struct {
    PyObject_HEAD
    PyObject *target; /* the armed write function; NULL: nothing armed */
    vectorcallfunc vectorcall;
} Forward;

static PyObject *Forward_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *target = ((Forward *)self)->target;
    if (target == NULL)
        Py_RETURN_NONE;
    Py_INCREF(target); /* the call may run Python code that sets another target */
    PyObject *result = PyObject_Vectorcall(target, args, nargsf, kwnames);
    Py_DECREF(target);
    return result;
}

static PyObject *Forward_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Forward() takes no arguments");
        return NULL;
    }
    Forward *f = (Forward *)type->tp_alloc(type, 0);
    if (f != NULL)
        f->vectorcall = Forward_vectorcall;
    return (PyObject *)f;
}

static int Forward_traverse(Forward *f, visitproc visit, void *arg) {
    Py_VISIT(f->target);
    return 0;
}

static int Forward_clear(Forward *f) {
    Py_CLEAR(f->target);
    return 0;
}

static void Forward_dealloc(Forward *f) {
    PyObject_GC_UnTrack(f);
    Forward_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *Forward_get_target(Forward *f, void *Py_UNUSED(closure)) {
    PyObject *t = f->target != NULL ? f->target : Py_None;
    Py_INCREF(t);
    return t;
}

static int Forward_set_target(Forward *f, PyObject *value, void *Py_UNUSED(closure)) {
    PyObject *t = (value == NULL || value == Py_None) ? NULL : value;
    Py_XINCREF(t);
    Py_XSETREF(f->target, t);
    return 0;
}

static PyGetSetDef Forward_getset[] = {
    {"target", (getter)Forward_get_target, (setter)Forward_set_target,
     "The function calls are handed to (None: each call returns None at once).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ForwardType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "blackbox.ring._cwriter.Forward",
    .tp_basicsize = sizeof(Forward),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Forward(): a callable that hands its arguments to .target, or returns None when it is None.",
    .tp_new = Forward_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Forward, vectorcall),
    .tp_dealloc = (destructor)Forward_dealloc,
    .tp_traverse = (traverseproc)Forward_traverse,
    .tp_clear = (inquiry)Forward_clear,
    .tp_getset = Forward_getset,
};

/* ------------------------------------------------------------------ signals
 *
 * State shared with the handler is plain memory read with atomics. The target
 * (where records go) is switched off before its buffer is released, and
 * release waits until no handler is inside it. Each signal's wrapped
 * disposition is double-buffered: an update fills the idle copy, then flips. */
typedef struct {
    char *records;
    uint64_t cap;
    Sequence *seq;
    pid_t pid;       /* the armed process: a forked child never writes */
    uint64_t tag[MAX_SIGNAL];     /* label id | kind | flags | device, per signal */
    int64_t detail_default;       /* string id of "default action" */
    int64_t detail[MAX_SIGNAL];   /* string id of how the wrapped handler handles it */
} SigTarget;

typedef struct {
    struct sigaction prev[2];
    int cur;       /* which prev is in force */
    int installed; /* our handler was put over prev[cur] */
} SigChain;

static SigTarget g_target;
static int g_target_on;  /* atomic */
static SigChain g_chain[MAX_SIGNAL];
static Py_buffer g_view;
static int g_have_view;
static PyObject *g_seq_ref;

static size_t put_decimal(char *out, long v) {
    char tmp[24];
    size_t n = 0, i = 0;
    if (v <= 0) {
        out[0] = '0';
        return 1;
    }
    while (v > 0 && n < sizeof tmp) {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    }
    while (n > 0)
        out[i++] = tmp[--n];
    return i;
}

/* The sender's command name into 16 bytes (zero padded): open/read/close only. */
static void sender_comm(pid_t pid, char comm[16]) {
    char path[48] = "/proc/";
    size_t n = 6 + put_decimal(path + 6, (long)pid);
    memcpy(path + n, "/comm", 6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t got = read(fd, comm, 15);
    close(fd);
    for (ssize_t i = 0; i < got; i++)
        if (comm[i] == '\n')
            comm[i] = 0;
}

/* The thread inside on_signal for each signal (0: none): a handler we wrapped that calls its previous one,
 * which is on_signal again (faulthandler.register(chain=True) after arm captured ours), would recurse until
 * the stack ran out; the nested call records nothing and hands nothing on. */
static pthread_t g_inside[MAX_SIGNAL];
static int is_ours(const struct sigaction *sa);

static int crash_signal(int sig) {
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT;
}

/* Where a crash's tracebacks go when faulthandler is the job's (whose own go where the job sent them: stderr):
 * the ring's crash region, through a descriptor the recorder keeps positioned there (-1: none; set by
 * signals_crash_fd). Written once per process, as faulthandler writes them: its first line, then every
 * thread's stack by CPython's own dump, which faulthandler's handler calls too (async-signal-safe: no lock,
 * no allocation). It is looked up at run time: 3.11 and 3.12 export it, 3.14 as PyUnstable_; where the
 * interpreter does not (3.10, 3.13), nothing is written and the record of the signal stays alone. */
typedef const char *(*DumpThreads)(int, PyInterpreterState *, PyThreadState *);
static DumpThreads g_dump;
static int g_crash_fd = -1; /* atomic */
static int g_crash_dumped;  /* atomic */

static const char *crash_words(int sig) {
    switch (sig) {
    case SIGSEGV: return "Segmentation fault";
    case SIGBUS: return "Bus error";
    case SIGFPE: return "Floating-point exception";
    case SIGILL: return "Illegal instruction";
    default: return "Aborted";
    }
}

static int put_text(int fd, const char *text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t done = write(fd, text, n);
        if (done <= 0)
            return -1;
        text += done;
        n -= (size_t)done;
    }
    return 0;
}

/* A heading of three parts, a blank line, then every thread's stack by the interpreter's dump. */
static void dump_stacks(int fd, const char *a, const char *b, const char *c) {
    if (put_text(fd, a) == 0 && put_text(fd, b) == 0 && put_text(fd, c) == 0 && put_text(fd, "\n\n") == 0)
        g_dump(fd, NULL, PyGILState_GetThisThreadState());
}

/* Returns the descriptor written to, -1: none. */
static int dump_crash(int sig) {
    int fd = __atomic_load_n(&g_crash_fd, __ATOMIC_ACQUIRE);
    if (fd < 0 || g_dump == NULL || __atomic_exchange_n(&g_crash_dumped, 1, __ATOMIC_ACQ_REL))
        return -1;
    dump_stacks(fd, "Fatal Python error: ", crash_words(sig), "");
    return fd;
}

static void dump_lookup(void) {
    if (g_dump == NULL) {
        g_dump = (DumpThreads)dlsym(RTLD_DEFAULT, "PyUnstable_DumpTracebackThreads");
        if (g_dump == NULL)
            g_dump = (DumpThreads)dlsym(RTLD_DEFAULT, "_Py_DumpTracebackThreads");
    }
}

/* Every thread's stack at a signal that ends the process while it shuts down, after the clean end (late
 * signals, below): into the crash region, through a descriptor of its own (signals_late_text), once, and
 * only while the interpreter is whole (its exit handlers run; not once finalization began, nor after the
 * exit record, when its threads' states may be freed). The descriptor is checked to be the ring still (the
 * job may have closed it and reused its number). A crash signal is headed as dump_crash heads it. */
static int g_late_fd = -1; /* atomic */
static int g_late_dumped;  /* atomic */
static dev_t g_late_dev;
static ino_t g_late_ino;
static int g_exit_written; /* atomic: the exit record is written (see "the exit status" below) */

static const char *stop_name(int sig) {
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return "a signal";
    }
}

static int interpreter_whole(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return !Py_IsFinalizing();
#else
    return !_Py_IsFinalizing();
#endif
}

static int late_dump(int sig) { /* returns the descriptor written to, -1: none */
    int fd = __atomic_load_n(&g_late_fd, __ATOMIC_ACQUIRE);
    if (fd < 0 || g_dump == NULL || __atomic_load_n(&g_exit_written, __ATOMIC_ACQUIRE) || !interpreter_whole() ||
        __atomic_exchange_n(&g_late_dumped, 1, __ATOMIC_ACQ_REL))
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != g_late_dev || st.st_ino != g_late_ino)
        return -1;
    if (crash_signal(sig))
        dump_stacks(fd, "Fatal Python error: ", crash_words(sig), "");
    else
        dump_stacks(fd, "Stack of every thread at ", stop_name(sig), ", while the process shut down");
    return fd;
}

/* A request to stop (SIGTERM, SIGINT, SIGHUP) taken while recording, whoever handled it: a helper that then
 * exits 0 shut down gracefully on request (a batch script's python, a scheduler's preemption), which is no
 * clean end to fold away (on_process_exit, signals_stop_taken). Set in the handler: one atomic store. */
static volatile sig_atomic_t g_stop_taken;

/* A fault the kernel raised for an instruction (a bad address, an illegal instruction, an integer division
 * by zero: si_code > 0) is given back to the kernel: once it is recorded (and its stacks written), the
 * disposition the job had is put back and the handler returns; the instruction runs again, faults again,
 * and the kernel delivers the signal as it does unarmed: its "segfault at ..." line in the kernel log, and
 * a core whose siginfo is the fault's (address, code), not a raise()'s. This is done where unarmed the
 * kernel's delivery is what ends the process: under the default action, and under faulthandler where it is
 * blackbox's own (signals_refault: the job has none unarmed), whose raise(), left pending while ours runs
 * (the signal is blocked in its handler), is taken back first. A job's own crash handler (PyTorch's, a
 * faulthandler the job enabled) is handed the signal as before: unarmed it is the one that ends the process.
 * (A fault another thread mends before the instruction runs again lets the job go on, as a retry would.) */
static void (*g_fh_fn)(int); /* atomic: faulthandler's handler, where it is blackbox's own; NULL: none */
static int g_fh_fd = -1;     /* atomic: where blackbox's own faulthandler writes (the crash region); -1: none */

static int kernel_fault(int sig, const siginfo_t *info) {
    if (info == NULL || info->si_code <= 0)
        return 0;
    if (sig == SIGFPE) /* an integer division's trap faults again; a floating-point trap may not */
        return info->si_code == FPE_INTDIV || info->si_code == FPE_INTOVF;
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL;
}

static int is_faulthandler(const struct sigaction *sa) {
    void (*fh)(int) = __atomic_load_n(&g_fh_fn, __ATOMIC_ACQUIRE);
    return fh != NULL && !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == fh;
}

/* The native frame of a fault: the faulting instruction, and the mapping that holds it (its file and the offset
 * in it: what addr2line reads), found in /proc/self/maps at the fault (open, read, close: no allocation, no
 * lock), written as one line after the crash's tracebacks (crash.py reads it):
 *   Native frame: instruction 0x7f3a5c2e1ad8 in /usr/lib/x86_64-linux-gnu/libc.so.6 at file offset 0x167ad8
 * or "in an anonymous mapping" (JIT code), or "in no mapping" (a jump through a bad pointer: 0x0 for a call
 * through a null function pointer). */
static uintptr_t fault_ip(const void *context) {
#if defined(__x86_64__)
    return (uintptr_t)((const ucontext_t *)context)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)((const ucontext_t *)context)->uc_mcontext.pc;
#else
    (void)context;
    return 0;
#endif
}

static const char *hex_field(const char *s, uintptr_t *out) {
    uintptr_t v = 0;
    const char *begin = s;
    for (;; s++) {
        int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
        if (d < 0 || s - begin >= 16)
            break;
        v = v * 16 + (uintptr_t)d;
    }
    *out = v;
    return s > begin ? s : NULL;
}

static const char *skip_field(const char *s) {
    while (*s == ' ')
        s++;
    while (*s != 0 && *s != ' ')
        s++;
    return s;
}

/* One line of /proc/self/maps: whether it holds ip; if so its path (may be empty) and ip's file offset. */
static int maps_line(const char *s, uintptr_t ip, char *path, size_t size, uintptr_t *file_off) {
    uintptr_t start, end, off;
    if ((s = hex_field(s, &start)) == NULL || *s++ != '-' || (s = hex_field(s, &end)) == NULL || ip < start ||
        ip >= end)
        return 0;
    s = skip_field(s); /* permissions */
    while (*s == ' ')
        s++;
    if ((s = hex_field(s, &off)) == NULL)
        return 0;
    s = skip_field(skip_field(s)); /* device, inode */
    while (*s == ' ')
        s++;
    size_t n = strlen(s);
    n = n < size - 1 ? n : size - 1;
    memcpy(path, s, n);
    path[n] = 0;
    *file_off = ip - start + off;
    return 1;
}

static size_t put_hex(char *out, uintptr_t v) {
    char tmp[16];
    size_t n = 0, i = 2;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v != 0 && n < sizeof tmp);
    out[0] = '0';
    out[1] = 'x';
    while (n > 0)
        out[i++] = tmp[--n];
    return i;
}

static size_t append(char *out, size_t n, const char *text) { /* the caller sized out for it */
    size_t k = strlen(text);
    memcpy(out + n, text, k);
    return n + k;
}

static void native_frame(int fd, const void *context) {
    uintptr_t ip = fault_ip(context), file_off = 0;
    char buf[4096], line[512], path[384] = {0}, text[512];
    size_t n_line = 0;
    int found = 0;
    int maps = context != NULL ? open("/proc/self/maps", O_RDONLY | O_CLOEXEC) : -1;
    if (maps < 0)
        return;
    ssize_t got;
    while (!found && (got = read(maps, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < got && !found; i++) {
            if (buf[i] != '\n') {
                if (n_line < sizeof line - 1)
                    line[n_line++] = buf[i];
                continue;
            }
            line[n_line] = 0;
            found = maps_line(line, ip, path, sizeof path, &file_off);
            n_line = 0;
        }
    close(maps);
    size_t n = append(text, 0, "Native frame: instruction ");
    n += put_hex(text + n, ip);
    n = append(text, n, !found ? " in no mapping" : path[0] == 0 ? " in an anonymous mapping" : " in ");
    if (found && path[0] != 0) {
        n = append(text, n, path);
        n = append(text, n, " at file offset ");
        n += put_hex(text + n, file_off);
    }
    text[n++] = '\n';
    text[n] = 0;
    put_text(fd, text);
}

/* The signal's disposition set to the default action (sigaction only). */
static void default_action(int sig) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
}

/* The raise() a handler under ours left pending for this thread (or the process), taken back. */
static void drop_pending(int sig) {
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    struct timespec none = {0, 0};
    for (int i = 0; i < 2 && sigtimedwait(&one, NULL, &none) == sig; i++) /* a thread's, then the process's */
        ;
}

/* Signals taken after the clean end go to the exit record's slots (late_slot): set by signals_release(1),
 * which leaves our handler in place, cleared by signals_arm and signals_forget. */
static int g_late; /* atomic */
static char *late_slot(uint64_t *seq, int fatal);

/* Set by signals_stand_in: this process is its PID namespace's first process (a container's entrypoint), or the
 * job's own process of a `blackbox run` that is that first process (unarmed, the job itself would be it). The kernel
 * drops a signal for which that process has no handler, whoever sent it (blackbox run passing one on from pid 1, a
 * group's kill, a terminal's Ctrl-\, the process itself; a SIGSEGV or SIGABRT sent too), but a fault the kernel
 * forced on it; armed, our handler is in force, so it reaches this process as any other, and one that is no forced
 * fault, while the default action is in force, is recorded and dropped here. */
static int g_stand_in;            /* atomic */
static pid_t g_stand_in_pid;      /* the process it was set in: a child forked past the at-fork hooks is not it */
static int64_t g_detail_stand_in; /* string id of how such a signal is said */

/* A signal the kernel forced on the process for a fault of its own (not sent by a process, nor raised): it ends
 * even a PID namespace's first process, whose default action the kernel otherwise spares. */
static int forced_fault(int sig, const siginfo_t *info) {
    return info != NULL && info->si_code > 0 &&
           (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP || sig == SIGSYS);
}

static void on_signal(int sig, siginfo_t *info, void *context) {
    int saved_errno = errno;
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP)
        g_stop_taken = 1;
    pthread_t self = pthread_self(), none = 0;
    if (__atomic_load_n(&g_inside[sig], __ATOMIC_ACQUIRE) == self)
        return; /* called back by the handler we hand it to: it has the signal already */
    int outer = __atomic_compare_exchange_n(&g_inside[sig], &none, self, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    SigChain *chain = &g_chain[sig];
    struct sigaction prev = chain->prev[__atomic_load_n(&chain->cur, __ATOMIC_ACQUIRE)];
    int to_default = !(prev.sa_flags & SA_SIGINFO) && prev.sa_handler == SIG_DFL;
    /* blackbox's own faulthandler stands where the job has the default action (unarmed, it has no faulthandler) */
    int dropped = (to_default || is_faulthandler(&prev)) && !forced_fault(sig, info) &&
                  __atomic_load_n(&g_stand_in, __ATOMIC_ACQUIRE) && getpid() == g_stand_in_pid;
    if (dropped)
        to_default = 0; /* nothing handed on (not to SIG_DFL, nor to our faulthandler): as for a first process */
    int crash = crash_signal(sig) && !dropped; /* a sent crash signal that is dropped is no crash */
    int fault = kernel_fault(sig, info), refault = fault && (to_default || is_faulthandler(&prev));
    __atomic_add_fetch(&g_inflight, 1, __ATOMIC_SEQ_CST);
    int armed = __atomic_load_n(&g_target_on, __ATOMIC_ACQUIRE) && g_target.pid == getpid();
    uint64_t late_seq = 0;
    char *late = armed ? NULL : late_slot(&late_seq, to_default || crash);
    int text_fd = -1; /* where the crash's tracebacks went, for its native frame */
    if (armed || late != NULL) {
        int64_t payload[PAYLOAD_WORDS];
        char comm[16] = {0};
        for (int i = 0; i < PAYLOAD_WORDS; i++)
            payload[i] = -1;
        payload[0] = dropped ? g_detail_stand_in : to_default || refault ? g_target.detail_default : g_target.detail[sig];
        if (info != NULL) {
            payload[2] = info->si_code;
            if (fault)
                payload[5] = (int64_t)(uintptr_t)info->si_addr;
            if (info->si_code <= 0 && info->si_pid > 0) { /* sent by a process (kill, tgkill, sigqueue) */
                payload[1] = info->si_pid;
                sender_comm(info->si_pid, comm);
                memcpy(&payload[3], comm, 16);
            }
        }
        if (late != NULL) {
            put_record(late, 1, late_seq, now_ns(), (uint64_t)pthread_self(), -1, sig, g_target.tag[sig], payload);
            if (to_default || crash)
                text_fd = late_dump(sig); /* before the default action (or the job's crash handler) ends it */
        } else {
            uint64_t seq = __atomic_add_fetch(&g_target.seq->value, 1, __ATOMIC_RELAXED);
            put_record(g_target.records, g_target.cap, seq, now_ns(), (uint64_t)pthread_self(), -1, sig,
                       g_target.tag[sig], payload);
            window_after(g_target.seq, seq);
            if (crash)
                text_fd = dump_crash(sig); /* before the job's handler, which ends the process */
            if (refault && !to_default)
                text_fd = __atomic_load_n(&g_fh_fd, __ATOMIC_ACQUIRE); /* faulthandler's, ours: it writes next */
        }
    }
    __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_SEQ_CST);
    if (dropped) {
        /* nothing handed on: as the kernel drops it for a namespace's first process */
    } else if (to_default) {
        default_action(sig);
        if (!refault)
            raise(sig); /* pending until this handler returns: then the default action, at once */
    } else if (prev.sa_flags & SA_SIGINFO) {
        if (prev.sa_sigaction != NULL)
            prev.sa_sigaction(sig, info, context);
    } else if (prev.sa_handler != SIG_IGN && prev.sa_handler != NULL) {
        prev.sa_handler(sig);
    }
    if (!to_default && crash) {
        /* A crash handler that put ours back and raised the signal again (a faulthandler enabled anew after
         * arm remembers ours as the handler before it): the default action, or it would come back forever. */
        struct sigaction cur;
        if (sigaction(sig, NULL, &cur) == 0 && (is_ours(&cur) || (refault && is_faulthandler(&cur))))
            default_action(sig);
        if (refault)
            drop_pending(sig); /* faulthandler's raise(): the fault itself comes again as this returns */
    }
    if (text_fd >= 0 && fault)
        native_frame(text_fd, context); /* after the tracebacks (faulthandler's, written by the handler above) */
    if (outer)
        __atomic_store_n(&g_inside[sig], (pthread_t)0, __ATOMIC_RELEASE);
    errno = saved_errno;
}

static int is_ours(const struct sigaction *sa) {
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_signal;
}

/* Our handler's disposition over `cur`, which becomes the chain's previous handler (the idle copy filled,
 * then flipped); `cur`'s mask and flags kept: SA_RESTART or not decides whether a blocked call returns to
 * run it. Async-signal-safe: plain memory and atomics. */
static struct sigaction ours_over(SigChain *chain, const struct sigaction *cur) {
    int idle = 1 - __atomic_load_n(&chain->cur, __ATOMIC_ACQUIRE);
    chain->prev[idle] = *cur;
    __atomic_store_n(&chain->cur, idle, __ATOMIC_RELEASE);
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_signal;
    ours.sa_mask = cur->sa_mask;
    ours.sa_flags = (cur->sa_flags & ~(SA_RESETHAND | SA_NODEFER)) | SA_SIGINFO | SA_ONSTACK;
    return ours;
}

/* Inside exit(), after the interpreter finished: Python's finalization put the default action back over our
 * handler for the signals it had handlers of (SIGINT, a job's SIGTERM handler), and faulthandler's end its
 * previous handlers (PYTHONFAULTHANDLER=1): ours goes back over every recorded signal whose disposition is
 * now the default action, which it keeps (it records, then ends the process by that default action), so a
 * signal that ends a process hung in a C library's teardown is told. Async-signal-safe: sigaction only. */
static void rewrap_for_exit(void) {
    for (int s = 1; s < MAX_SIGNAL; s++) {
        SigChain *chain = &g_chain[s];
        struct sigaction cur;
        if (!chain->installed || g_target.tag[s] == 0 || sigaction(s, NULL, &cur) != 0 || is_ours(&cur) ||
            (cur.sa_flags & SA_SIGINFO) || cur.sa_handler != SIG_DFL)
            continue;
        struct sigaction ours = ours_over(chain, &cur);
        sigaction(s, &ours, NULL);
    }
}

/* signals_arm(buffer, records_offset, capacity, sequence, detail_default): record signals into this ring. */
static PyObject *signals_arm(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *buffer, *seq;
    Py_ssize_t offset;
    unsigned long long cap;
    long long detail_default;
    if (!PyArg_ParseTuple(args, "OnKO!L", &buffer, &offset, &cap, &SequenceType, &seq, &detail_default))
        return NULL;
    if (__atomic_load_n(&g_target_on, __ATOMIC_ACQUIRE)) {
        PyErr_SetString(PyExc_RuntimeError, "another armed recorder of this process records its signals");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (cap == 0 || offset < 0 || view.len < offset || (unsigned long long)(view.len - offset) / RECORD_SIZE < cap) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "buffer too small for the record region");
        return NULL;
    }
    if (g_have_view) /* left by a forked parent's arm: this process's copy of that export */
        PyBuffer_Release(&g_view);
    g_view = view;
    g_have_view = 1;
    Py_XSETREF(g_seq_ref, Py_NewRef(seq));
    g_target.records = (char *)view.buf + offset;
    g_target.cap = cap;
    g_target.seq = (Sequence *)seq;
    g_target.pid = getpid();
    g_target.detail_default = detail_default;
    __atomic_store_n(&g_late, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_late_fd, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_stand_in, 0, __ATOMIC_SEQ_CST); /* until signals_stand_in says otherwise */
    for (int s = 0; s < MAX_SIGNAL; s++) {
        g_target.tag[s] = 0;
        g_target.detail[s] = 0;
    }
    __atomic_store_n(&g_target_on, 1, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* signals_watch(signum, tag, detail) -> "wrapped" | "ours" | "ignored":
 * put the handler over the signal's current disposition unless it is SIG_IGN. */
static PyObject *signals_watch(PyObject *Py_UNUSED(m), PyObject *args) {
    int sig;
    unsigned long long tag;
    long long detail;
    if (!PyArg_ParseTuple(args, "iKL", &sig, &tag, &detail))
        return NULL;
    if (sig <= 0 || sig >= MAX_SIGNAL) {
        PyErr_Format(PyExc_ValueError, "signal number %d out of range", sig);
        return NULL;
    }
    g_target.tag[sig] = tag;
    g_target.detail[sig] = detail;
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (is_ours(&cur))
        return PyUnicode_FromString("ours");
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
        return PyUnicode_FromString("ignored"); /* stays ignored, also for the job's exec'd children */
    SigChain *chain = &g_chain[sig];
    struct sigaction ours = ours_over(chain, &cur), old;
    if (sigaction(sig, &ours, &old) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (memcmp(&old, &cur, sizeof old) != 0 && !is_ours(&old)) { /* changed between the read and the swap */
        int other = 1 - __atomic_load_n(&chain->cur, __ATOMIC_ACQUIRE);
        chain->prev[other] = old;
        __atomic_store_n(&chain->cur, other, __ATOMIC_RELEASE);
    }
    chain->installed = 1;
    return PyUnicode_FromString("wrapped");
}

/* signals_stand_in(detail): signals but a fault's, with the default action in force, are recorded with `detail` and
 * dropped (g_stand_in), in this process only; the caller has checked that this process is pid 1, or that blackbox
 * run is and this process is its child. */
static PyObject *signals_stand_in(PyObject *Py_UNUSED(m), PyObject *arg) {
    long long detail = PyLong_AsLongLong(arg);
    if (detail == -1 && PyErr_Occurred())
        return NULL;
    g_detail_stand_in = detail;
    g_stand_in_pid = getpid();
    __atomic_store_n(&g_stand_in, 1, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* signals_ours(signum) -> bool: our handler is the signal's disposition now (the tick's cheap check: where it
 * is, nothing changed since signals_watch put it there, the job's Python handler included, whose install
 * would have replaced ours). */
static PyObject *signals_ours(PyObject *Py_UNUSED(m), PyObject *arg) {
    long sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred())
        return NULL;
    if (sig <= 0 || sig >= MAX_SIGNAL) {
        PyErr_Format(PyExc_ValueError, "signal number %ld out of range", sig);
        return NULL;
    }
    struct sigaction cur;
    if (sigaction((int)sig, NULL, &cur) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyBool_FromLong(is_ours(&cur));
}

/* Put back the disposition we wrapped, where ours is still the one installed. */
static void restore_all(void) {
    for (int s = 1; s < MAX_SIGNAL; s++) {
        SigChain *chain = &g_chain[s];
        if (!chain->installed)
            continue;
        struct sigaction cur;
        if (sigaction(s, NULL, &cur) == 0 && is_ours(&cur))
            sigaction(s, &chain->prev[__atomic_load_n(&chain->cur, __ATOMIC_ACQUIRE)], NULL);
        chain->installed = 0;
    }
}

static void drop_target(void) {
    Py_CLEAR(g_seq_ref);
    if (g_have_view) {
        g_have_view = 0;
        PyBuffer_Release(&g_view);
    }
}

/* signals_release(keep_late=False): stop recording into the ring, restore the dispositions, wait for
 * handlers in flight. keep_late (the clean end at interpreter exit): our handler stays, and a signal the
 * process takes while it shuts down goes to the exit record's slots (late_slot) once they are armed. */
static PyObject *signals_release(PyObject *Py_UNUSED(m), PyObject *args) {
    int keep_late = 0;
    if (!PyArg_ParseTuple(args, "|p", &keep_late))
        return NULL;
    __atomic_store_n(&g_crash_fd, -1, __ATOMIC_SEQ_CST);
    if (keep_late)
        __atomic_store_n(&g_late, 1, __ATOMIC_SEQ_CST);
    else
        restore_all();
    __atomic_store_n(&g_target_on, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) != 0) /* another thread's handler: a few syscalls */
        sched_yield();
    drop_target();
    Py_RETURN_NONE;
}

/* signals_crash_fd(fd): where a crash's tracebacks go (dump_crash); -1: nowhere. The descriptor stays the
 * caller's: it sets -1 here before it closes it. Returns whether this interpreter can write them. */
static PyObject *signals_crash_fd(PyObject *Py_UNUSED(m), PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    dump_lookup();
    __atomic_store_n(&g_crash_fd, fd < 0 ? -1 : fd, __ATOMIC_RELEASE);
    return PyBool_FromLong(g_dump != NULL);
}

/* signals_late_text(fd): where late_dump writes (the crash region, a descriptor positioned there that stays
 * open for the rest of the process); -1: nowhere. Returns whether this interpreter can write the stacks. */
static PyObject *signals_late_text(PyObject *Py_UNUSED(m), PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    dump_lookup();
    __atomic_store_n(&g_late_fd, -1, __ATOMIC_SEQ_CST);
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        g_late_dev = st.st_dev;
        g_late_ino = st.st_ino;
        __atomic_store_n(&g_late_dumped, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&g_late_fd, fd, __ATOMIC_SEQ_CST);
    }
    return PyBool_FromLong(g_dump != NULL);
}

/* signals_forget(): in a forked child, let go of the parent's ring without waiting on its threads. */
static PyObject *signals_forget(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    __atomic_store_n(&g_crash_fd, -1, __ATOMIC_SEQ_CST); /* the parent's crash region */
    __atomic_store_n(&g_fh_fd, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_crash_dumped, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_target_on, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_inflight, 0, __ATOMIC_SEQ_CST); /* a parent thread's count, copied by fork */
    g_stop_taken = 0;                                   /* the parent's request to stop, not the child's */
    __atomic_store_n(&g_stand_in, 0, __ATOMIC_SEQ_CST); /* a child of the job's own process is not it */
    __atomic_store_n(&g_late, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_late_fd, -1, __ATOMIC_SEQ_CST);
    restore_all();
    drop_target();
    Py_RETURN_NONE;
}

/* signals_refault(on, fd=-1) -> bool: faulthandler is blackbox's own (on), writing to fd, or not; on, the
 * handler it installed for SIGSEGV (under ours, or in force) is remembered as faulthandler's (kernel_fault,
 * above). Returns whether one was found. The descriptor stays the caller's: it sets -1 before it closes it. */
static PyObject *signals_refault(PyObject *Py_UNUSED(m), PyObject *args) {
    int on, fd = -1;
    if (!PyArg_ParseTuple(args, "p|i", &on, &fd))
        return NULL;
    __atomic_store_n(&g_fh_fd, on && fd >= 0 ? fd : -1, __ATOMIC_RELEASE);
    void (*fh)(int) = NULL;
    struct sigaction cur;
    if (on && sigaction(SIGSEGV, NULL, &cur) == 0) {
        if (is_ours(&cur))
            cur = g_chain[SIGSEGV].prev[__atomic_load_n(&g_chain[SIGSEGV].cur, __ATOMIC_ACQUIRE)];
        if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN)
            fh = cur.sa_handler;
    }
    __atomic_store_n(&g_fh_fn, fh, __ATOMIC_RELEASE);
    return PyBool_FromLong(fh != NULL);
}

/* signals_installed() -> list of signal numbers our handler is installed over. */
static PyObject *signals_stop_taken(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    return PyBool_FromLong(g_stop_taken != 0);
}

static PyObject *signals_installed(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int s = 1; s < MAX_SIGNAL; s++) {
        struct sigaction cur;
        if (g_chain[s].installed && sigaction(s, NULL, &cur) == 0 && is_ours(&cur)) {
            PyObject *n = PyLong_FromLong(s);
            if (n == NULL || PyList_Append(out, n) < 0) {
                Py_XDECREF(n);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(n);
        }
    }
    return out;
}

/* ------------------------------------------------------------------ stack walking (Python 3.11+)
 * stack_walks(idents, max_depth, skip_ident, skip_prefix, frame_ids) -> [None | (ids, keys, frames, depth)]:
 * the innermost max_depth frames of each thread's stack, for collect/stacks.py's stack table.
 *
 * Why in C, and why with the collector off: walking another thread's stack materialises frame
 * objects (PyFrame_GetBack), and that allocation can start a garbage collection whose finalizers
 * (a tensor's deallocation, say) release the GIL. The thread whose stack is being walked then runs
 * on, pops the frame whose raw pointer PyFrame_GetBack is holding, and the frame object is bound to
 * freed memory: a crash, reproduced with a sampler walking a training loop (and the same with
 * frame.f_back in Python). With the collector disabled, nothing during the walk can run Python code
 * or release the GIL; it is enabled again before any reference is dropped (dropping a frame can run
 * code), so the job never runs with its collector off on our account.
 *
 * For each thread: first the innermost frames whose file starts with skip_prefix are skipped (only
 * for skip_ident: blackbox's own frames on a synchronous sample). Each frame gets a key naming its
 * code object and instruction (unique while the caller keeps the code object alive, which it does
 * for every key it stores); ids is the tuple of frame_ids[key], innermost first, or None when one is
 * missing, and then frames holds the frame objects (for the caller to intern them: text and keys
 * come from the same walk); depth counts every frame, beyond the cap too. None: no such thread. */
#if PY_VERSION_HEX >= 0x030B0000
#define MAX_WALK 64

static PyObject *frame_key(PyFrameObject *f) {
    PyCodeObject *code = PyFrame_GetCode(f);
    uintptr_t p = (uintptr_t)code;
    int lasti = PyFrame_GetLasti(f);
    Py_DECREF(code); /* the frame keeps it alive; only its address is used */
    if ((p & 15) == 0 && (uint64_t)p >> 4 < ((uint64_t)1 << 43) && lasti >= 0 && lasti < (1 << 20))
        return PyLong_FromUnsignedLongLong(((uint64_t)p >> 4) << 20 | (uint64_t)lasti);
    return Py_BuildValue("(Ki)", (unsigned long long)p, lasti); /* never equal to an int key */
}

/* One thread's walk from its innermost frame: None or (ids or None, keys, frames, depth), the frames
 * tuple holding a reference to each frame walked (the caller drops it where ids is not None). */
static PyObject *walk_one(PyObject *start, int max_depth, PyObject *skip, PyObject *frame_ids) {
    PyFrameObject *f = (PyFrameObject *)Py_NewRef(start);
    while (f != NULL && skip != Py_None) {
        PyCodeObject *code = PyFrame_GetCode(f);
        Py_ssize_t own = PyUnicode_Tailmatch(code->co_filename, skip, 0, PY_SSIZE_T_MAX, -1);
        Py_DECREF(code);
        if (own < 0) {
            Py_DECREF(f);
            return NULL;
        }
        if (!own)
            break;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f); /* still referenced by its thread's stack (or by the frame it called): no code runs */
        f = back;
    }
    if (f == NULL)
        Py_RETURN_NONE;
    PyObject *held = PyTuple_New(max_depth);
    if (held == NULL) {
        Py_DECREF(f);
        return NULL;
    }
    int n = 0;
    Py_ssize_t depth = 0;
    while (f != NULL) {
        PyFrameObject *back = PyFrame_GetBack(f);
        if (n < max_depth)
            PyTuple_SET_ITEM(held, n++, (PyObject *)f); /* the tuple takes the reference */
        else
            Py_DECREF(f); /* referenced by the frame it called, which we hold: no code runs */
        depth++;
        f = back;
    }
    if (n < max_depth && _PyTuple_Resize(&held, n) < 0)
        return NULL;
    PyObject *keys = PyTuple_New(n), *ids = PyTuple_New(n);
    int hit = 1;
    if (keys == NULL || ids == NULL)
        goto error;
    for (int i = 0; i < n; i++) {
        PyObject *key = frame_key((PyFrameObject *)PyTuple_GET_ITEM(held, i));
        if (key == NULL)
            goto error;
        PyTuple_SET_ITEM(keys, i, key);
        if (hit) {
            PyObject *id = PyDict_GetItemWithError(frame_ids, key); /* int or tuple keys: no code runs */
            if (id == NULL) {
                if (PyErr_Occurred())
                    goto error;
                hit = 0;
            } else {
                PyTuple_SET_ITEM(ids, i, Py_NewRef(id));
            }
        }
    }
    if (!hit) {
        Py_DECREF(ids);
        ids = Py_NewRef(Py_None);
    }
    return Py_BuildValue("(NNNn)", ids, keys, held, depth);
error:
    Py_XDECREF(keys);
    Py_XDECREF(ids);
    Py_DECREF(held);
    return NULL;
}

/* {thread ident: its innermost frame} of this interpreter's threads alone. Not sys._current_frames(): it
 * walks every interpreter's threads, and a subinterpreter with a GIL of its own (3.12+) runs them while
 * we read: its frames, materialised from here, crashed the job (free(): invalid pointer). Our GIL keeps
 * this interpreter's thread list and frames still; a thread now running in a subinterpreter shows the
 * frames it left here. */
static PyObject *own_frames(void) {
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); ts != NULL;
         ts = PyThreadState_Next(ts)) {
        PyFrameObject *frame = PyThreadState_GetFrame(ts);
        if (frame == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        PyObject *key = PyLong_FromUnsignedLong(ts->thread_id);
        int bad = key == NULL || PyDict_SetItem(out, key, (PyObject *)frame) < 0;
        Py_XDECREF(key);
        Py_DECREF(frame);
        if (bad)
            goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *stack_walks(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *idents, *skip, *frame_ids;
    int max_depth;
    unsigned long long skip_ident;
    if (!PyArg_ParseTuple(args, "O!iKOO!", &PyTuple_Type, &idents, &max_depth, &skip_ident, &skip, &PyDict_Type,
                          &frame_ids))
        return NULL;
    if (max_depth < 1 || max_depth > MAX_WALK || (skip != Py_None && !PyUnicode_Check(skip))) {
        PyErr_SetString(PyExc_ValueError, "stack_walks(idents, 1..64, skip_ident, str or None, dict)");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(idents);
    PyObject *out = PyList_New(count), *current = NULL;
    if (out == NULL)
        return NULL;
    int collecting = PyGC_Disable(); /* see above: no collection, so no code, while frames are walked */
    current = own_frames();
    int failed = current == NULL;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        PyObject *ident = PyTuple_GET_ITEM(idents, i);
        PyObject *start = PyDict_GetItemWithError(current, ident);
        PyObject *walked;
        if (start == NULL) {
            failed = PyErr_Occurred() != NULL;
            walked = Py_NewRef(Py_None);
        } else {
            unsigned long long id = PyLong_AsUnsignedLongLong(ident);
            if (id == (unsigned long long)-1 && PyErr_Occurred()) {
                failed = 1;
                break;
            }
            walked = walk_one(start, max_depth, id == skip_ident ? skip : Py_None, frame_ids);
            failed = walked == NULL;
        }
        if (walked != NULL)
            PyList_SET_ITEM(out, i, walked);
    }
    if (collecting)
        PyGC_Enable();
    /* Only now drop what we hold: a frame whose function has returned since may free its locals. */
    Py_XDECREF(current);
    if (failed) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the threads' frames could not be read");
        Py_DECREF(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *walked = PyList_GET_ITEM(out, i);
        if (walked != Py_None && PyTuple_GET_ITEM(walked, 0) != Py_None) { /* known frames: no need of them */
            PyObject *frames = PyTuple_GET_ITEM(walked, 2);
            PyTuple_SET_ITEM(walked, 2, Py_NewRef(Py_None));
            Py_DECREF(frames);
        }
    }
    return out;
}
#endif

/* ------------------------------------------------------------------ the exit status
 * exit_record_arm(fd, records_offset, capacity, seq, tag, step, detail) -> bool: at the interpreter's
 * exit, once the recorder has written its clean end, have the process's real exit status written as
 * one `exit` record (seq `seq`, its slot in the ring open at `fd`) when libc's exit() runs.
 *
 * Why in C: a top-level `raise SystemExit(2)` never calls sys.exit, and CPython passes the status to
 * exit() only after finalization (Python's atexit callbacks, ours among them, ran before): no Python
 * code can see it. glibc's on_exit() hands the status to a handler that runs inside exit(). By then
 * Python objects may be freed and the recorder's mapping unmapped, so the handler touches neither: it
 * owns a mapping of its own of the one page that holds the slot (made here, with the descriptor; a
 * mapping needs no descriptor afterwards), and the plain words it writes, taken here. The record
 * follows the commit rule (seq first, commit last). Nothing else writes to the ring by then (the
 * writer is gone), so the seqs from `seq` on are this target's: it maps the pages of EXIT_SLOTS slots.
 * A signal the process takes while it shuts down (the signal recorder released with keep_late) is
 * recorded into the first of them still free, as on_signal records it while armed (late_slot), and the
 * exit record takes the next; a signal after it too (exit() runs the C libraries' teardown, C++ static
 * destructors among them, after this handler, registered last): a SIGTERM that ends a process hung in its
 * shutdown, before or inside exit(), is told, not guessed.
 * A forked child that exits never writes (the pid is checked). Returns False where the C library has no
 * on_exit().
 *
 * fold (optional: folded.jsonl's path, the line, the ring's path), for a helper of `blackbox run`: where
 * the status is 0, the line is appended to that file (one O_APPEND write) and the ring removed instead;
 * any other status, or a fold that fails, writes the record and keeps the ring. Only the exit status
 * tells a clean end from `raise SystemExit(3)`, so the helper's ring is kept or folded here; one that took
 * a request to stop (g_stop_taken) keeps its ring whatever its status. */
#define FOLD_MAX 4096
typedef struct {
    int on;
    char file[FOLD_MAX], ring[FOLD_MAX], line[FOLD_MAX];
    size_t line_len;
} FoldTarget;

static FoldTarget g_fold;

#define EXIT_SLOTS 6 /* signals taken while the process shuts down, the exit record among them */
typedef struct {
    char *page[EXIT_SLOTS]; /* our own mapping of the page that holds each slot */
    size_t page_len;
    char *slot[EXIT_SLOTS];
    uint64_t seq, tag; /* seq: the first slot's */
    unsigned next;     /* atomic: the next slot free */
    int64_t step, detail;
    pid_t pid;
} ExitTarget;

static ExitTarget g_exit;
static int exit_slot_claim(unsigned limit, unsigned *out);
static int g_exit_on;         /* atomic */
static int g_exit_ran;        /* atomic: on_process_exit ran (once) */

static int g_exit_registered; /* on_exit() called once per process */

#if defined(__GLIBC__)
static void on_process_exit(int status, void *Py_UNUSED(arg)) {
    if (!__atomic_load_n(&g_exit_on, __ATOMIC_ACQUIRE) || g_exit.pid != getpid() ||
        __atomic_exchange_n(&g_exit_ran, 1, __ATOMIC_ACQ_REL))
        return; /* once: exit() runs each handler once anyway */
    if (g_fold.on && (status & 0xFF) == 0 && !g_stop_taken) {
        int fd = open(g_fold.file, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            ssize_t n = write(fd, g_fold.line, g_fold.line_len);
            close(fd);
            if (n == (ssize_t)g_fold.line_len && unlink(g_fold.ring) == 0) {
                __atomic_store_n(&g_exit_on, 0, __ATOMIC_RELEASE); /* its ring is gone: nothing more to write */
                return;
            }
        }
    }
    int64_t payload[PAYLOAD_WORDS];
    payload[0] = g_exit.detail;
    for (int i = 1; i < PAYLOAD_WORDS; i++)
        payload[i] = -1;
    unsigned i;
    if (exit_slot_claim(EXIT_SLOTS, &i)) { /* after the late signals (a slot is always left: late_slot) */
        /* the status a parent's wait() sees is its low 8 bits */
        put_record(g_exit.slot[i], 1, g_exit.seq + i, now_ns(), (uint64_t)pthread_self(), g_exit.step,
                   status & 0xFF, g_exit.tag, payload);
    }
    __atomic_store_n(&g_exit_written, 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(&g_late, __ATOMIC_ACQUIRE))
        rewrap_for_exit();
}
#endif

static void exit_target_drop(void) {
    __atomic_store_n(&g_exit_on, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) != 0) /* a late signal's handler writing a slot */
        sched_yield();
    for (int i = 0; i < EXIT_SLOTS; i++) {
        if (g_exit.page[i] != NULL) {
            munmap(g_exit.page[i], g_exit.page_len);
            g_exit.page[i] = NULL;
        }
    }
}

/* The next free slot below `limit` (lock-free: a compare-and-swap, retried only when another claim won). */
static int exit_slot_claim(unsigned limit, unsigned *out) {
    unsigned cur = __atomic_load_n(&g_exit.next, __ATOMIC_ACQUIRE);
    while (cur < limit) {
        if (__atomic_compare_exchange_n(&g_exit.next, &cur, cur + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *out = cur;
            return 1;
        }
    }
    return 0;
}

/* The slot for a signal taken after the clean end (NULL: none), its seq in *seq. A signal that does not end
 * the process (`fatal` 0: its handler takes it) takes one of the first EXIT_SLOTS - 2, so that a storm of
 * them leaves the exit record its slot and one more for a signal that ends the process inside exit(). In
 * on_signal, between its g_inflight increment and decrement: exit_target_drop waits for those. */
static char *late_slot(uint64_t *seq, int fatal) {
    if (!__atomic_load_n(&g_late, __ATOMIC_ACQUIRE) || !__atomic_load_n(&g_exit_on, __ATOMIC_ACQUIRE) ||
        g_exit.pid != getpid())
        return NULL;
    int written = __atomic_load_n(&g_exit_written, __ATOMIC_ACQUIRE);
    unsigned i;
    if (!exit_slot_claim(!fatal ? EXIT_SLOTS - 2 : written ? EXIT_SLOTS : EXIT_SLOTS - 1, &i))
        return NULL;
    *seq = g_exit.seq + i;
    return g_exit.slot[i];
}

static PyObject *exit_record_arm(PyObject *Py_UNUSED(m), PyObject *args) {
    int fd;
    long long offset, step, detail;
    unsigned long long cap, seq, tag;
    const char *fold_file = NULL, *fold_line = NULL, *fold_ring = NULL;
    Py_ssize_t file_len = 0, line_len = 0, ring_len = 0;
    if (!PyArg_ParseTuple(args, "iLKKKLL|y#y#y#", &fd, &offset, &cap, &seq, &tag, &step, &detail, &fold_file,
                          &file_len, &fold_line, &line_len, &fold_ring, &ring_len))
        return NULL;
    if (fold_file != NULL && (fold_line == NULL || fold_ring == NULL || file_len >= FOLD_MAX ||
                              line_len >= FOLD_MAX || ring_len >= FOLD_MAX || line_len == 0 ||
                              strlen(fold_file) != (size_t)file_len || strlen(fold_ring) != (size_t)ring_len)) {
        PyErr_SetString(PyExc_ValueError, "exit_record_arm: fold takes a file, a line and a ring, each under 4 KiB");
        return NULL;
    }
#if defined(__GLIBC__)
    long page = sysconf(_SC_PAGESIZE);
    if (cap < EXIT_SLOTS || seq == 0 || offset < 0 || page <= 0 || offset % RECORD_SIZE != 0) {
        PyErr_SetString(PyExc_ValueError, "exit_record_arm: capacity >= 6, seq > 0, records_offset aligned");
        return NULL;
    }
    exit_target_drop();
    g_exit.page_len = (size_t)page;
    for (int i = 0; i < EXIT_SLOTS; i++) { /* each slot's page (the slots may wrap to the ring's start) */
        unsigned long long at = (unsigned long long)offset + ((seq + (unsigned long long)i) % cap) * RECORD_SIZE;
        unsigned long long start = at - at % (unsigned long long)page;
        void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
        if (p == MAP_FAILED) {
            PyErr_SetFromErrno(PyExc_OSError);
            exit_target_drop();
            return NULL;
        }
        g_exit.page[i] = (char *)p;
        g_exit.slot[i] = (char *)p + (at - start);
    }
    if (!g_exit_registered) {
        if (on_exit(on_process_exit, NULL) != 0) {
            exit_target_drop();
            PyErr_SetString(PyExc_OSError, "on_exit() refused the handler");
            return NULL;
        }
        g_exit_registered = 1;
    }
    g_exit.next = 0;
    g_exit_ran = 0;
    g_exit_written = 0;
    g_exit.seq = seq;
    g_exit.tag = tag;
    g_exit.step = step;
    g_exit.detail = detail;
    g_exit.pid = getpid();
    g_fold.on = fold_file != NULL;
    if (g_fold.on) {
        memcpy(g_fold.file, fold_file, (size_t)file_len + 1);
        memcpy(g_fold.ring, fold_ring, (size_t)ring_len + 1);
        memcpy(g_fold.line, fold_line, (size_t)line_len);
        g_fold.line_len = (size_t)line_len;
    }
    __atomic_store_n(&g_exit_on, 1, __ATOMIC_RELEASE);
    Py_RETURN_TRUE;
#else
    (void)fd;
    Py_RETURN_FALSE;
#endif
}

/* exit_record_release(): write nothing at exit after all (the ring was armed again, or a test). */
static PyObject *exit_record_release(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(args)) {
    exit_target_drop();
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the phase around a call
 * PhaseCall(function, event, begin_kind, end_kind, name): a callable that writes a phase_begin event
 * (event(begin_kind, name), which returns the monotonic ns it read), calls `function` with its own
 * arguments, then writes the phase_end event (event(end_kind, name, duration)) whatever that returned or
 * raised, and hands back exactly its result or its exception. In C so that it adds no Python frame: a
 * traceback through it, and a stack sampled while it runs, are the job's own (torch_hooks.py puts one
 * around torch.autograd.backward). The writer swallows its own errors, so an event that raises raised
 * the job's exception (its signal handler ran meanwhile): that one reaches the job (the call is not
 * made where the begin event raised), the call's own exception at the end of its chain of contexts
 * (chain_last). Attributes it does not hold go to `function`; __wrapped__ is it. */
typedef struct {
    PyObject_HEAD
    PyObject *function, *event, *begin, *end, *name;
    vectorcallfunc vectorcall;
} PhaseCall;

/* `cause` becomes the context at the end of `exc`'s chain of contexts, as Python chains an exception raised
 * while another is handled: the chain may already hold one (the job's handler raised again while blackbox
 * handled the first: that one's context is the first), and setting `exc`'s own context would drop it. Not
 * where `cause` is in the chain already, or the chain is longer than bounded or loops. */
static void chain_last(PyObject *exc, PyObject *cause) {
    PyObject *last = exc;
    for (int k = 0; k < 64; k++) {
        PyObject *next = PyException_GetContext(last); /* a new reference: the chain keeps it alive */
        if (next == NULL) {
            PyObject *c = cause;
            for (int j = 0; c != NULL && j < 64; j++) { /* no loop through `cause`'s own chain */
                if (c == exc)
                    return;
                PyObject *up = PyException_GetContext(c);
                Py_XDECREF(up);
                c = up;
            }
            PyException_SetContext(last, Py_NewRef(cause));
            return;
        }
        Py_DECREF(next);
        if (next == cause)
            return;
        last = next;
    }
}

static PyObject *PhaseCall_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PhaseCall *p = (PhaseCall *)self;
    PyObject *begin_args[2] = {p->begin, p->name};
    PyObject *stamp = PyObject_Vectorcall(p->event, begin_args, 2, NULL);
    if (stamp == NULL) /* the writer swallows its own errors: this is the job's (its signal handler's) */
        return NULL;
    long long t0 = PyLong_AsLongLong(stamp);
    Py_DECREF(stamp);
    if (t0 == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        t0 = 0;
    }
    PyObject *result = PyObject_Vectorcall(p->function, args, nargsf, kwnames);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* the job's exception, if any, kept aside while the end is written */
    PyObject *duration = t0 > 0 ? PyLong_FromLongLong(now_ns() - t0) : Py_NewRef(Py_None);
    PyObject *done = NULL;
    if (duration != NULL) {
        PyObject *end_args[3] = {p->end, p->name, duration};
        done = PyObject_Vectorcall(p->event, end_args, 3, NULL);
        Py_DECREF(duration);
    }
    if (done == NULL && duration != NULL) {
        /* The job's signal handler raised while the end was written: that exception reaches the job,
         * with the call's own exception, if any, as its context (as Python chains one raised while
         * another is handled). */
        Py_XDECREF(result);
        if (value != NULL) {
            PyObject *t2, *v2, *tb2;
            PyErr_Fetch(&t2, &v2, &tb2);
            PyErr_NormalizeException(&t2, &v2, &tb2);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL)
                PyException_SetTraceback(value, tb);
            if (v2 != NULL && value != NULL)
                chain_last(v2, value);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            PyErr_Restore(t2, v2, tb2);
        }
        return NULL;
    }
    Py_XDECREF(done);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return result;
}

static int PhaseCall_init(PhaseCall *self, PyObject *args, PyObject *kwds) {
    PyObject *function, *event, *begin, *end, *name;
    static char *kwlist[] = {"function", "event", "begin_kind", "end_kind", "name", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!O!U", kwlist, &function, &event, &PyLong_Type, &begin,
                                     &PyLong_Type, &end, &name))
        return -1;
    if (!PyCallable_Check(function) || !PyCallable_Check(event)) {
        PyErr_SetString(PyExc_TypeError, "PhaseCall: function and event must be callable");
        return -1;
    }
    Py_XSETREF(self->function, Py_NewRef(function));
    Py_XSETREF(self->event, Py_NewRef(event));
    Py_XSETREF(self->begin, Py_NewRef(begin));
    Py_XSETREF(self->end, Py_NewRef(end));
    Py_XSETREF(self->name, Py_NewRef(name));
    self->vectorcall = PhaseCall_call;
    return 0;
}

static int PhaseCall_traverse(PhaseCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    Py_VISIT(self->event);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->name);
    return 0;
}

static int PhaseCall_clear(PhaseCall *self) {
    Py_CLEAR(self->function);
    Py_CLEAR(self->event);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->name);
    return 0;
}

static void PhaseCall_dealloc(PhaseCall *self) {
    PyObject_GC_UnTrack(self);
    PhaseCall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *PhaseCall_getattro(PyObject *self, PyObject *name) {
    PhaseCall *p = (PhaseCall *)self;
    if (p->function == NULL)
        return PyObject_GenericGetAttr(self, name);
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0)
        return Py_NewRef(p->function);
    /* the function's own words first: __name__, __qualname__, __module__, __doc__, __dict__, __code__... */
    if (PyUnicode_Check(name) && PyUnicode_READ_CHAR(name, 0) == '_' &&
        PyUnicode_CompareWithASCIIString(name, "__class__") != 0) {
        PyObject *got = PyObject_GetAttr(p->function, name);
        if (got != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
            return got;
        PyErr_Clear();
    }
    PyObject *got = PyObject_GenericGetAttr(self, name);
    if (got != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return got;
    PyErr_Clear();
    return PyObject_GetAttr(p->function, name);
}

static PyObject *PhaseCall_repr(PhaseCall *self) {
    return self->function != NULL ? PyObject_Repr(self->function) : PyUnicode_FromString("<PhaseCall>");
}

static PyTypeObject PhaseCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "blackbox.ring._cwriter.PhaseCall",
    .tp_basicsize = sizeof(PhaseCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A phase's begin and end events around a call, with no Python frame of its own.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PhaseCall_init,
    .tp_dealloc = (destructor)PhaseCall_dealloc,
    .tp_traverse = (traverseproc)PhaseCall_traverse,
    .tp_clear = (inquiry)PhaseCall_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PhaseCall, vectorcall),
    .tp_getattro = PhaseCall_getattro,
    .tp_repr = (reprfunc)PhaseCall_repr,
};

/* job_exception_test(callable or None): the test report() asks before it swallows an exception. */
static PyObject *job_exception_test(PyObject *Py_UNUSED(m), PyObject *test) {
    if (test != Py_None && !PyCallable_Check(test)) {
        PyErr_SetString(PyExc_TypeError, "job_exception_test takes a callable or None");
        return NULL;
    }
    Py_XSETREF(g_job_exception, test == Py_None ? NULL : Py_NewRef(test));
    Py_RETURN_NONE;
}

/* ---- sys.excepthook in C ----
 * chain_excepthook(record, prev, late) -> a C callable for sys.excepthook: record(type, value, tb), which returns
 * an exception a signal handler of the job's raised meanwhile (or None), then prev(type, value, tb), the hook that
 * was there before, then late(that exception). A Python function checks for pending signal handlers at its first
 * instruction, outside any try: a handler of the job's that raised there (PyTorch's SIGCHLD handler as a
 * DataLoader worker ended) made Python print "Error in sys.excepthook" and the job's traceback as "Original
 * exception". Called from C, what record raises, at its entry or in it, is kept and reported after prev. */
static PyObject *fetch_raised(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static void restore_raised(PyObject *value) { /* steals value; NULL: nothing to restore */
    if (value == NULL)
        return;
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(value);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(value)), value, PyException_GetTraceback(value));
#endif
}

static PyObject *chained_excepthook(PyObject *self, PyObject *args) {
    PyObject *record = PyTuple_GET_ITEM(self, 0), *prev = PyTuple_GET_ITEM(self, 1);
    PyObject *late = NULL;
    for (int tries = 0; tries < 2; tries++) { /* a handler runs once: a second try records what it cut short */
        PyObject *r = PyObject_Call(record, args, NULL);
        if (r != NULL) {
            if (r != Py_None && late == NULL)
                late = r; /* what the handler raised inside record's own try */
            else
                Py_DECREF(r);
            break;
        }
        PyObject *raised = fetch_raised();
        if (late == NULL)
            late = raised;
        else
            Py_XDECREF(raised);
    }
    PyObject *out = PyObject_Call(prev, args, NULL);
    if (late != NULL) {
        PyObject *pending = fetch_raised(); /* prev's own failure, if any: kept for Python to report */
        PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(self, 2), late);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        Py_DECREF(late);
        restore_raised(pending);
    }
    return out;
}

static PyMethodDef chained_excepthook_def = {"excepthook", chained_excepthook, METH_VARARGS,
                                             "blackbox's sys.excepthook: record, then the hook before it."};

static PyObject *chain_excepthook(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *record, *prev, *late;
    if (!PyArg_ParseTuple(args, "OOO:chain_excepthook", &record, &prev, &late))
        return NULL;
    PyObject *parts = PyTuple_Pack(3, record, prev, late);
    if (parts == NULL)
        return NULL;
    PyObject *hook = PyCFunction_New(&chained_excepthook_def, parts);
    Py_DECREF(parts);
    return hook;
}

static PyMethodDef module_methods[] = {
    {"chain_excepthook", chain_excepthook, METH_VARARGS,
     "chain_excepthook(record, prev, late) -> sys.excepthook calling record, then prev, then late(what record raised)."},
    {"job_exception_test", job_exception_test, METH_O, "set the test of the job's own exceptions"},
    {"signals_arm", signals_arm, METH_VARARGS,
     "signals_arm(buffer, records_offset, capacity, sequence, detail_default): record signals into this ring."},
    {"signals_watch", signals_watch, METH_VARARGS,
     "signals_watch(signum, tag, detail) -> 'wrapped' | 'ours' | 'ignored'."},
    {"signals_release", signals_release, METH_VARARGS,
     "signals_release(keep_late=False): restore the dispositions (or keep ours, for the shutdown) and stop recording."},
    {"signals_forget", signals_forget, METH_NOARGS, "In a forked child: drop the parent's ring."},
    {"signals_late_text", signals_late_text, METH_VARARGS,
     "signals_late_text(fd): where the stacks at a signal that ends the shutdown go (-1: nowhere)."},
    {"signals_ours", signals_ours, METH_O, "signals_ours(signum) -> bool: our handler is its disposition now."},
    {"signals_stand_in", signals_stand_in, METH_O,
     "signals_stand_in(detail): as a PID namespace's first process, drop a signal with no handler in force."},
    {"signals_refault", signals_refault, METH_VARARGS,
     "signals_refault(on, fd=-1) -> bool: faulthandler under the crash signals is blackbox's own; a kernel fault then "
     "goes back to the kernel once recorded (as unarmed: its log line, the core's siginfo)."},
    {"signals_crash_fd", signals_crash_fd, METH_VARARGS,
     "signals_crash_fd(fd) -> bool: where a crash's tracebacks go while faulthandler is the job's (-1: nowhere)."},
    {"signals_installed", signals_installed, METH_NOARGS, "Signal numbers the handler is installed over."},
    {"signals_stop_taken", signals_stop_taken, METH_NOARGS,
     "Whether SIGTERM, SIGINT or SIGHUP reached the handler since the module loaded."},
    {"exit_record_arm", exit_record_arm, METH_VARARGS,
     "exit_record_arm(fd, records_offset, capacity, seq, tag, step, detail[, fold_file, fold_line, fold_ring]) -> "
     "bool: write the exit status at exit() (or, a helper's status 0, fold it)."},
    {"exit_record_release", exit_record_release, METH_NOARGS, "Write no exit record at exit()."},
#if PY_VERSION_HEX >= 0x030B0000
    {"stack_walks", stack_walks, METH_VARARGS,
     "stack_walks(idents, max_depth, skip_ident, skip_prefix, frame_ids) -> [None | (ids, keys, frames, depth)]."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cwriter_module = {
    PyModuleDef_HEAD_INIT, "blackbox.ring._cwriter", "The ring's write path and signal recorder in C.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__cwriter(void) {
    if (PyType_Ready(&SequenceType) < 0 || PyType_Ready(&WriterType) < 0 || PyType_Ready(&PhaseCallType) < 0 ||
        PyType_Ready(&ForwardType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&cwriter_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Sequence", (PyObject *)&SequenceType) < 0 ||
        PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddObjectRef(m, "PhaseCall", (PyObject *)&PhaseCallType) < 0 ||
        PyModule_AddObjectRef(m, "Forward", (PyObject *)&ForwardType) < 0 ||
#if defined(__GLIBC__)
        PyModule_AddIntConstant(m, "EXIT_RECORD", 1) < 0) {
#else
        PyModule_AddIntConstant(m, "EXIT_RECORD", 0) < 0) {
#endif
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
