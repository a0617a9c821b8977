/* One native thread that copies rows for the consumer while it runs Python: the copy lane.
 *
 * A parked loader (the consumer gathers every batch itself, workers idle) spends 10-15 us of
 * Python per batch on bookkeeping (reserve, deliver, count) beside a 40 us copy. Run in turn,
 * they add up; a Python worker could overlap them, but each hand-off between Python threads moves
 * the GIL and wakes a thread on the other CPU, which on a VM costs as much as the copy. This
 * thread holds no GIL and is handed work through memory: it spins briefly between jobs, so a
 * steady stream of batches crosses no system call, and sleeps on a condition variable once the
 * stream pauses (a training step).
 *
 * start(src, row_bytes, rows, out, limit) -> Pending: queues the copy of rows rows[0], rows[1],
 * ... of src (a C-contiguous buffer cut into rows of row_bytes) to rows 0, 1, ... of out; a run of
 * consecutive rows is one memcpy. Every row is checked against [0, min(limit, rows in src)) first
 * (an IndexError, nothing queued). The Pending keeps the three buffers exported until the copy is
 * done, so neither the mapping nor out can go away under the thread; its wait() returns once out
 * holds the rows (the GIL released while it waits), and dropping a Pending waits too.
 *
 * Jobs run one at a time in the order queued. A full queue, or a forked child (whose copy of the
 * thread does not exist), copies in the caller instead: the result is the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RELAX() _mm_pause()
#else
#define RELAX() ((void)0)
#endif

#define QUEUE 64
/* the thread looks for more work this long after a job before it sleeps, and a waiter spins this
 * long before it sleeps: longer than a batch's bookkeeping, far shorter than a training step */
#define SPIN_NS 200000

typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    const int64_t *rows;
    Py_ssize_t n, rb;
    uint64_t ticket;
} Job;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static Job queue[QUEUE];
static uint64_t head = 0, tail = 0;         /* under mu: next job to run, next free slot */
static _Atomic uint64_t queued = 0;         /* tickets handed out (the last job's) */
static _Atomic uint64_t completed = 0;      /* the last finished job's ticket (jobs run in order) */
static _Atomic int waiters = 0;             /* threads asleep (or about to be) on done_cv */
static int sleeping = 0;                    /* under mu: the lane waits on work_cv */
static int running = 0;                     /* under mu: the lane thread exists in this process */

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void copy_rows(uint8_t *dst, const uint8_t *src, const int64_t *rows, Py_ssize_t n,
                      Py_ssize_t rb) {
    for (Py_ssize_t j = 0; j < n;) {
        int64_t r = rows[j];
        Py_ssize_t k = 1;
        while (j + k < n && rows[j + k] == r + k) k++;
        memcpy(dst + j * rb, src + r * rb, (size_t)(k * rb));
        j += k;
    }
}

static void *lane(void *arg) {
    (void)arg;
    for (;;) {
        /* spin for the next job, then sleep until one is queued */
        uint64_t since = 0;
        unsigned spins = 0;
        while (atomic_load(&queued) == atomic_load(&completed)) {
            RELAX();
            if (++spins % 256) continue;
            uint64_t t = now_ns();
            if (!since) since = t;
            if (t - since < SPIN_NS) continue;
            pthread_mutex_lock(&mu);
            sleeping = 1;
            while (head == tail) pthread_cond_wait(&work_cv, &mu);
            sleeping = 0;
            pthread_mutex_unlock(&mu);
            break;
        }
        pthread_mutex_lock(&mu);
        if (head == tail) {  /* the spin saw a ticket whose job is being written: look again */
            pthread_mutex_unlock(&mu);
            continue;
        }
        Job job = queue[head % QUEUE];
        pthread_mutex_unlock(&mu);
        copy_rows(job.dst, job.src, job.rows, job.n, job.rb);
        pthread_mutex_lock(&mu);
        head++;  /* the slot is free only now: its rows pointer was read during the copy */
        pthread_mutex_unlock(&mu);
        atomic_store(&completed, job.ticket);
        if (atomic_load(&waiters)) {
            pthread_mutex_lock(&mu);
            pthread_cond_broadcast(&done_cv);
            pthread_mutex_unlock(&mu);
        }
    }
    return NULL;
}

static void after_fork_child(void) {
    /* no lane thread here: queued jobs were the parent's; nothing waits on them in this child
     * (an engine refuses to run after fork), and new ones start a thread of their own */
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&work_cv, NULL);
    pthread_cond_init(&done_cv, NULL);
    head = tail = 0;
    atomic_store(&completed, atomic_load(&queued));
    atomic_store(&waiters, 0);
    sleeping = running = 0;
}

static void wait_ticket(uint64_t ticket) {
    if (atomic_load(&completed) >= ticket) return;
    uint64_t since = now_ns();
    unsigned spins = 0;
    while (atomic_load(&completed) < ticket) {
        RELAX();
        if (++spins % 256) continue;
        if (now_ns() - since < SPIN_NS) continue;
        pthread_mutex_lock(&mu);
        atomic_fetch_add(&waiters, 1);
        while (atomic_load(&completed) < ticket) pthread_cond_wait(&done_cv, &mu);
        atomic_fetch_sub(&waiters, 1);
        pthread_mutex_unlock(&mu);
        return;
    }
}

/* -- Pending ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    uint64_t ticket;  /* 0: done (copied in the caller, or waited for) */
    int held;         /* the buffers are still exported */
    Py_buffer src, rows, out;
} Pending;

static void release(Pending *p) {
    if (p->ticket) {
        uint64_t t = p->ticket;
        Py_BEGIN_ALLOW_THREADS
        wait_ticket(t);
        Py_END_ALLOW_THREADS
        p->ticket = 0;
    }
    if (p->held) {
        p->held = 0;
        PyBuffer_Release(&p->src);
        PyBuffer_Release(&p->rows);
        PyBuffer_Release(&p->out);
    }
}

static PyObject *pending_wait(Pending *p, PyObject *unused) {
    (void)unused;
    release(p);
    Py_RETURN_NONE;
}

static PyObject *pending_done(Pending *p, void *unused) {
    (void)unused;
    return PyBool_FromLong(!p->ticket || atomic_load(&completed) >= p->ticket);
}

static void pending_dealloc(Pending *p) {
    release(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef pending_methods[] = {
    {"wait", (PyCFunction)pending_wait, METH_NOARGS,
     "wait()\n--\n\nReturns once the rows are in out (the GIL released meanwhile)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef pending_getset[] = {
    {"done", (getter)pending_done, NULL, "Whether the copy has finished.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PendingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "headrace._store._copylane.Pending",
    .tp_basicsize = sizeof(Pending),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A copy queued on the lane; wait() for it.",
    .tp_dealloc = (destructor)pending_dealloc,
    .tp_methods = pending_methods,
    .tp_getset = pending_getset,
};

static int ensure_lane(void) {  /* under mu */
    if (running) return 0;
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, lane, NULL);
    pthread_attr_destroy(&attr);
    if (err) return -1;
    running = 1;
    return 0;
}

static PyObject *start(PyObject *self, PyObject *args) {
    (void)self;
    Pending *p = PyObject_New(Pending, &PendingType);
    if (p == NULL) return NULL;
    p->ticket = 0;
    p->held = 0;
    Py_ssize_t rb, limit;
    if (!PyArg_ParseTuple(args, "y*ny*w*n", &p->src, &rb, &p->rows, &p->out, &limit)) {
        Py_DECREF(p);
        return NULL;
    }
    p->held = 1;
    Py_ssize_t n = p->rows.len / 8;
    if (rb <= 0 || p->rows.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "row_bytes must be > 0 and rows int64");
        goto fail;
    }
    if (p->out.len < n * rb) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, %zd rows of %zd need %zd",
                     p->out.len, n, rb, n * rb);
        goto fail;
    }
    Py_ssize_t nrows = p->src.len / rb;
    if (limit < 0 || limit > nrows) limit = nrows;
    const int64_t *rows = (const int64_t *)p->rows.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (rows[j] < 0 || rows[j] >= limit) {
            PyErr_Format(PyExc_IndexError, "row %lld is outside 0..%zd", (long long)rows[j],
                         limit - 1);
            goto fail;
        }
    }
    Job job = {(uint8_t *)p->out.buf, (const uint8_t *)p->src.buf, rows, n, rb, 0};
    pthread_mutex_lock(&mu);
    if (tail - head >= QUEUE || ensure_lane() < 0) {
        pthread_mutex_unlock(&mu);
        Py_BEGIN_ALLOW_THREADS
        copy_rows(job.dst, job.src, job.rows, n, rb);
        Py_END_ALLOW_THREADS
        return (PyObject *)p;  /* done already: wait() only releases the buffers */
    }
    job.ticket = atomic_load(&queued) + 1;
    queue[tail % QUEUE] = job;
    tail++;
    atomic_store(&queued, job.ticket);
    if (sleeping) pthread_cond_signal(&work_cv);
    pthread_mutex_unlock(&mu);
    p->ticket = job.ticket;
    return (PyObject *)p;
fail:
    Py_DECREF(p);
    return NULL;
}

static PyMethodDef methods[] = {
    {"start", start, METH_VARARGS,
     "start(src, row_bytes, rows, out, limit) -> Pending: copies rows rows[j] of src to row j "
     "of out on the lane thread (limit < 0: every row of src is valid)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_copylane", NULL, -1, methods};

PyMODINIT_FUNC PyInit__copylane(void) {
    if (PyType_Ready(&PendingType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    pthread_atfork(NULL, NULL, after_fork_child);
    return m;
}
