/* blackbox.ring._cwriter: the write path in C (optional; writer.py falls back to Python).
 *
 * It writes exactly the bytes the Python path writes (FORMAT.md, "Record slots");
 * tests/test_writer_backends.py checks the two byte for byte. What it buys: a
 * mark() is one C call with no Python frame, and the seq, the timestamp and the
 * whole record are written while the GIL is held, so no other thread can slip
 * between taking a seq and committing its slot.
 *
 * Commit rule, as in the Python path: the seq word is stored first, then the
 * other fields, then the commit word (a release store). A process killed at any
 * instruction leaves commit != seq in a slot it was writing.
 *
 * Label strings are interned by a Python callable (the slow path owns the
 * string region and its lock); this module only looks ids up in the shared dict.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the C write path assumes a little-endian host; the Python path is used elsewhere"
#endif

#define RECORD_SIZE 128
#define PAYLOAD_WORDS 9
#define FLAG_VALUE 1

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int have_view;
    char *records;
    uint64_t cap;
    uint64_t seq; /* the last seq handed out */
    int64_t step; /* the step in force, -1 before the first */
    PyObject *ids;      /* dict: label -> int id, shared with the Python intern */
    PyObject *intern;   /* callable(label) -> int id */
    PyObject *on_error; /* callable(exception) */
    uint64_t mark_tag, mark_value_tag, step_tag, sample_tag;
    int dead;
} Writer;

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* what time.monotonic_ns() reads on Linux */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void put(Writer *w, uint64_t seq, int64_t t, int64_t step, int64_t value, uint64_t tag,
                       const int64_t *payload) {
    uint64_t *q = (uint64_t *)(w->records + (seq % w->cap) * RECORD_SIZE);
    __atomic_store_n(&q[0], seq, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    q[1] = (uint64_t)t;
    q[2] = (uint64_t)PyThread_get_thread_ident();
    q[3] = (uint64_t)step;
    q[4] = (uint64_t)value;
    q[5] = tag;
    if (payload)
        memcpy(&q[6], payload, PAYLOAD_WORDS * 8);
    else
        memset(&q[6], 0, PAYLOAD_WORDS * 8);
    __atomic_store_n(&q[15], seq, __ATOMIC_RELEASE);
}

/* Report the pending exception through on_error (once the writer is dead, drop it). */
static PyObject *report(Writer *w) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!w->dead && w->on_error != NULL) {
        PyErr_NormalizeException(&type, &value, &tb);
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

/* value -> (int64, flags); returns -1 on error. */
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
    int64_t lid = label_id(w, a[0]);
    if (lid < 0 || w->dead) /* interning runs Python code: the writer may have been killed meanwhile */
        return PyErr_Occurred() ? report(w) : Py_NewRef(Py_None);
    int64_t value = 0;
    uint64_t tag = w->mark_tag;
    if (a[1] != NULL && a[1] != Py_None) {
        if (int_value(a[1], &value) < 0)
            return report(w);
        tag = w->mark_value_tag;
    }
    put(w, ++w->seq, now_ns(), w->step, value, (uint64_t)lid | tag, NULL);
    Py_RETURN_NONE;
}

static PyObject *Writer_step(Writer *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->dead)
        Py_RETURN_NONE;
    PyObject *a[1] = {NULL};
    if (parse(args, nargs, kwnames, STEP_NAMES, 1, 0, a) < 0)
        return report(w);
    int64_t n = w->step + 1;
    if (a[0] != NULL && a[0] != Py_None) {
        if (int_value(a[0], &n) < 0)
            return report(w);
        if (n < 0) {
            PyErr_Format(PyExc_ValueError, "step must be >= 0, got %lld", (long long)n);
            return report(w);
        }
    }
    w->step = n;
    put(w, ++w->seq, now_ns(), n, n, w->step_tag, NULL);
    Py_RETURN_NONE;
}

static PyObject *Writer_event(Writer *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->dead)
        return PyLong_FromLong(0);
    PyObject *a[5] = {NULL, NULL, NULL, NULL, NULL};
    int64_t kind, value = 0, device = -1, lid = 0, payload[PAYLOAD_WORDS];
    uint64_t flags = 0;
    if (parse(args, nargs, kwnames, EVENT_NAMES, 5, 1, a) < 0 || int_value(a[0], &kind) < 0)
        goto fail;
    if (a[4] != NULL && a[4] != Py_None && payload_words(a[4], payload, 0) < 0)
        goto fail;
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
    int64_t t = now_ns();
    uint64_t tag = (uint64_t)lid | (uint64_t)kind << 32 | flags << 40 | ((uint64_t)device & 0xFFFF) << 48;
    put(w, ++w->seq, t, w->step, value, tag, (a[4] != NULL && a[4] != Py_None) ? payload : NULL);
    return PyLong_FromLongLong(t);
fail:
    Py_DECREF(report(w));
    return PyLong_FromLong(0);
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
    put(w, ++w->seq, now_ns(), w->step, 0, w->sample_tag | ((uint64_t)device & 0xFFFF) << 48, payload);
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
    PyObject *buffer, *ids, *intern, *on_error;
    Py_ssize_t offset;
    unsigned long long cap, mark_tag, mark_value_tag, step_tag, sample_tag;
    static char *kwlist[] = {"buffer", "records_offset", "capacity", "ids", "intern", "on_error",
                             "mark_tag", "mark_value_tag", "step_tag", "sample_tag", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnKO!OOKKKK", kwlist, &buffer, &offset, &cap, &PyDict_Type, &ids,
                                     &intern, &on_error, &mark_tag, &mark_value_tag, &step_tag, &sample_tag))
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
    if ((unsigned long long)(w->view.len - offset) / RECORD_SIZE < cap || w->view.len < offset ||
        ((uintptr_t)((char *)w->view.buf + offset) & 7) != 0) {
        release(w);
        PyErr_SetString(PyExc_ValueError, "buffer too small or record region not 8-byte aligned");
        return -1;
    }
    w->dead = 0;
    w->records = (char *)w->view.buf + offset;
    w->cap = cap;
    w->seq = 0;
    w->step = -1;
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
    Py_VISIT(w->ids);
    Py_VISIT(w->intern);
    Py_VISIT(w->on_error);
    return 0;
}

static int Writer_clear(Writer *w) {
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

static struct PyModuleDef cwriter_module = {
    PyModuleDef_HEAD_INIT, "blackbox.ring._cwriter", "The ring's write path in C.", -1, NULL,
};

PyMODINIT_FUNC PyInit__cwriter(void) {
    if (PyType_Ready(&WriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&cwriter_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
