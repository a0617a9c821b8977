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
 * The lane runs jobs one at a time in the order queued. A job is cut into pieces of about
 * PIECE_BYTES that whoever works on it claims one at a time: a waiter joins the job it waits for
 * (the lane's current one, or one not taken yet, which it then does alone) and copies pieces
 * beside the lane instead of spinning, so a copy that takes longer than the consumer's Python
 * runs on both CPUs; and a lane descheduled on a busy machine never leaves the consumer waiting
 * on work it could do. A full queue copies in the caller. In a forked child
 * (whose copy of the thread does not exist) the parent's jobs are never copied and waits on them
 * return at once; new ones start a lane of the child's own.
 *
 * start_checked(src, row_bytes, rows, ids, aux, bits, out) -> Pending: the same for a first read
 * that checks what it copies (_crcrows.take_checked's work, see _crc32c.h): wait() returns
 * (new, bad) as take_checked does. A verifying first epoch then copies on the lane too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_crc32c.h"
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

/* a job's state: queued, taken (someone copies its pieces), copied */
enum { QUEUED = 0, TAKEN = 1, COPIED = 2 };
/* a piece: copied (and checked) in one call; large enough that claiming it costs nothing beside
 * the copy, small enough that two threads finish a batch's copy together */
#define PIECE_BYTES (64 << 10)

/* What the threads working on one job share (in its Pending, which outlives the job's slot). */
typedef struct {
    _Atomic Py_ssize_t next;  /* first row no one has claimed */
    _Atomic int active;       /* threads working on the job; -1 once the last one closed it */
    _Atomic Py_ssize_t added; /* a checked copy's newly verified rows, summed over its pieces */
    Py_ssize_t piece;         /* rows a piece */
    Py_ssize_t *piece_bad;    /* a checked copy's bad rows in each piece, listed from bad + the
                               * piece's first row until the job closes */
} Share;

typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    const int64_t *rows;
    Py_ssize_t n, rb;
    /* a checked copy when ids is set: checked_copy's arguments, its results into the Pending */
    const int64_t *ids;
    const uint32_t *want;
    uint8_t *bm;
    Py_ssize_t *added, *nbad;
    int64_t *bad;
    _Atomic int *state;  /* the Pending's, which outlives its slot: a waiter that takes the job
                          * before the lane does clears the slot's pointer (under mu) first */
    Share *sh;           /* the Pending's too */
} Job;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static Job queue[QUEUE];
static _Atomic uint64_t head = 0, tail = 0; /* written under mu: next job to take, next free slot */
static _Atomic int waiters = 0;             /* threads asleep (or about to be) on done_cv */
static int sleeping = 0;                    /* under mu: the lane waits on work_cv */
static int running = 0;                     /* under mu: the lane thread exists in this process */
static uint64_t generation = 0;             /* forks seen by this process (a child's jobs are lost) */

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

static void run_piece(const Job *job, Py_ssize_t j0, Py_ssize_t j1) {
    Py_ssize_t m = j1 - j0, rb = job->rb;
    if (job->ids == NULL) {
        copy_rows(job->dst + j0 * rb, job->src, job->rows + j0, m, rb);
        return;
    }
    Py_ssize_t added = 0, nbad = 0;
    checked_copy(job->dst + j0 * rb, job->src, job->rows + j0, job->ids + j0, m, rb, job->bm,
                 job->want, &added, job->bad + j0, &nbad);
    if (added) atomic_fetch_add(&job->sh->added, added);
    job->sh->piece_bad[j0 / job->sh->piece] = nbad;
}

static void finish(_Atomic int *state) {
    atomic_store(state, COPIED);
    if (atomic_load(&waiters)) {
        pthread_mutex_lock(&mu);
        pthread_cond_broadcast(&done_cv);
        pthread_mutex_unlock(&mu);
    }
}

/* The last thread to leave a job: every piece is done. A checked copy's bad rows, listed piece
 * by piece (each piece's sorted, at positions relative to it), become one sorted list. */
static void close_job(const Job *job) {
    Share *sh = job->sh;
    if (job->ids != NULL) {
        Py_ssize_t total = 0, pieces = job->n ? (job->n + sh->piece - 1) / sh->piece : 0;
        for (Py_ssize_t q = 0; q < pieces; q++) {
            const int64_t *from = job->bad + q * sh->piece;  /* never behind the list's end */
            for (Py_ssize_t b = 0; b < sh->piece_bad[q]; b++)
                job->bad[total++] = from[b] + q * sh->piece;
        }
        *job->nbad = total;
        *job->added = atomic_load(&sh->added);
    }
    finish(job->state);  /* the Pending may go once this is stored: nothing touches it after */
}

/* Copies pieces of a job the caller joined (counted in active) until none is left to claim,
 * then leaves it; the last to leave closes it. After leaving, the job is not touched again. */
static void work_on(const Job *job) {
    Share *sh = job->sh;
    for (;;) {
        Py_ssize_t j0 = atomic_fetch_add(&sh->next, sh->piece);
        if (j0 >= job->n) break;
        run_piece(job, j0, j0 + sh->piece < job->n ? j0 + sh->piece : job->n);
    }
    int a = atomic_load(&sh->active);
    for (;;) {
        if (a == 1) {  /* the last one: no piece is left unclaimed, and the others finished theirs */
            if (atomic_compare_exchange_weak(&sh->active, &a, -1)) {
                close_job(job);
                return;
            }
        } else if (atomic_compare_exchange_weak(&sh->active, &a, a - 1)) {
            return;
        }
    }
}

/* Joins a job someone works on (active > 0); 0 when it closed already. */
static int join(Share *sh) {
    int a = atomic_load(&sh->active);
    while (a > 0 && !atomic_compare_exchange_weak(&sh->active, &a, a + 1)) {}
    return a > 0;
}

static void *lane(void *arg) {
    (void)arg;
    for (;;) {
        /* spin for the next job, then sleep until one is queued */
        uint64_t since = 0;
        unsigned spins = 0;
        while (atomic_load(&head) == atomic_load(&tail)) {
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
        /* the oldest job nobody took yet (a waiter may have copied some itself) */
        Job job;
        int got = 0;
        pthread_mutex_lock(&mu);
        while (head != tail) {
            job = queue[head % QUEUE];
            head++;
            if (job.state != NULL) {  /* NULL: a waiter took it */
                atomic_store(&job.sh->active, 1);
                atomic_store(job.state, TAKEN);
                got = 1;
                break;
            }
        }
        pthread_mutex_unlock(&mu);
        if (!got) continue;
        work_on(&job);
    }
    return NULL;
}

static void after_fork_child(void) {
    /* no lane thread here: the parent's queued jobs will never run in this child (its waits
     * return at once, see wait_job), and new ones start a thread of their own */
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&work_cv, NULL);
    pthread_cond_init(&done_cv, NULL);
    head = tail = 0;
    atomic_store(&waiters, 0);
    sleeping = running = 0;
    generation++;
}

/* Waits (GIL released) until the job is copied, copying pieces of it meanwhile: a job the lane
 * has not taken yet (the lane descheduled, or busy with an earlier one) the waiter takes; one the
 * lane is copying it joins. Then it spins briefly for the pieces others still copy, and sleeps. */
static void wait_job(_Atomic int *state, const Job *job) {
    int joined = 0;
    if (atomic_load(state) == QUEUED) {
        pthread_mutex_lock(&mu);
        if (atomic_load(state) == QUEUED) {  /* still in its slot: clear the slot, take it */
            for (uint64_t i = head; i != tail; i++) {
                if (queue[i % QUEUE].state == state) {
                    queue[i % QUEUE].state = NULL;
                    break;
                }
            }
            atomic_store(&job->sh->active, 1);
            atomic_store(state, TAKEN);
            joined = 1;
        }
        pthread_mutex_unlock(&mu);
    }
    if (!joined && atomic_load(state) == TAKEN) joined = join(job->sh);
    if (joined) work_on(job);
    uint64_t since = now_ns();
    unsigned spins = 0;
    while (atomic_load(state) != COPIED) {
        RELAX();
        if (++spins % 256) continue;
        if (now_ns() - since < SPIN_NS) continue;
        pthread_mutex_lock(&mu);
        atomic_fetch_add(&waiters, 1);
        while (atomic_load(state) != COPIED) pthread_cond_wait(&done_cv, &mu);
        atomic_fetch_sub(&waiters, 1);
        pthread_mutex_unlock(&mu);
        return;
    }
}

/* -- Pending ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    _Atomic int state;  /* COPIED once done (also when copied in the caller) */
    uint64_t generation;
    int held;           /* the buffers are still exported */
    int checked;        /* start_checked's: ids and aux (and bits, when has_bits) held too */
    int has_bits;
    Job job;
    Share sh;
    Py_buffer src, rows, out, ids, aux, bits;
    Py_ssize_t added, nbad;  /* a checked copy's results, once done */
    int64_t *bad;
} Pending;

static void release(Pending *p) {
    if (atomic_load(&p->state) != COPIED && p->generation == generation) {
        Py_BEGIN_ALLOW_THREADS
        wait_job(&p->state, &p->job);
        Py_END_ALLOW_THREADS
    }
    atomic_store(&p->state, COPIED);
    if (p->held) {
        p->held = 0;
        PyBuffer_Release(&p->src);
        PyBuffer_Release(&p->rows);
        PyBuffer_Release(&p->out);
        if (p->checked) {
            PyBuffer_Release(&p->ids);
            PyBuffer_Release(&p->aux);
            if (p->has_bits) PyBuffer_Release(&p->bits);
        }
    }
}

static PyObject *pending_wait(Pending *p, PyObject *unused) {
    (void)unused;
    release(p);
    if (!p->checked) Py_RETURN_NONE;
    return Py_BuildValue("ny#", p->added, (const char *)p->bad,
                         p->nbad * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *pending_done(Pending *p, void *unused) {
    (void)unused;
    return PyBool_FromLong(atomic_load(&p->state) == COPIED);
}

static void pending_dealloc(Pending *p) {
    release(p);
    PyMem_Free(p->bad);
    PyMem_Free(p->sh.piece_bad);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef pending_methods[] = {
    {"wait", (PyCFunction)pending_wait, METH_NOARGS,
     "wait()\n--\n\nReturns once the rows are in out (the GIL released meanwhile); a checked "
     "copy's (new, bad)."},
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

static Pending *new_pending(void);

/* Queues p's job (built and checked by the caller); with the queue full, or no thread, the
 * caller copies it now. */
static PyObject *queue_job(Pending *p) {
    Py_ssize_t rb = p->job.rb;
    p->sh.piece = PIECE_BYTES / rb > 0 ? PIECE_BYTES / rb : 1;
    p->job.sh = &p->sh;
    pthread_mutex_lock(&mu);
    if (tail - head >= QUEUE || ensure_lane() < 0) {
        pthread_mutex_unlock(&mu);
        atomic_store(&p->sh.active, 1);
        atomic_store(&p->state, TAKEN);
        Py_BEGIN_ALLOW_THREADS
        work_on(&p->job);
        Py_END_ALLOW_THREADS
        return (PyObject *)p;  /* done already: wait() only releases the buffers */
    }
    atomic_store(&p->state, QUEUED);
    queue[tail % QUEUE] = p->job;
    tail++;
    if (sleeping) pthread_cond_signal(&work_cv);
    pthread_mutex_unlock(&mu);
    return (PyObject *)p;
}

static PyObject *start(PyObject *self, PyObject *args) {
    (void)self;
    Pending *p = new_pending();
    if (p == NULL) return NULL;
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
    p->job = (Job){(uint8_t *)p->out.buf, (const uint8_t *)p->src.buf, rows, n, rb, NULL, NULL,
                   NULL, NULL, NULL, NULL, &p->state, NULL};
    return queue_job(p);
fail:
    Py_DECREF(p);
    return NULL;
}

static Pending *new_pending(void) {
    Pending *p = PyObject_New(Pending, &PendingType);
    if (p == NULL) return NULL;
    atomic_store(&p->state, COPIED);  /* nothing to wait for until queued */
    p->generation = generation;
    p->held = p->checked = p->has_bits = 0;
    p->added = p->nbad = 0;
    p->bad = NULL;
    atomic_store(&p->sh.next, 0);
    atomic_store(&p->sh.active, 0);
    atomic_store(&p->sh.added, 0);
    p->sh.piece = 1;
    p->sh.piece_bad = NULL;
    return p;
}

static PyObject *start_checked(PyObject *self, PyObject *args) {
    (void)self;
    Pending *p = new_pending();
    if (p == NULL) return NULL;
    Py_ssize_t rb, n;
    PyObject *bits_obj;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*Ow*", &p->src, &rb, &p->rows, &p->ids, &p->aux,
                          &bits_obj, &p->out)) {
        Py_DECREF(p);
        return NULL;
    }
    p->held = p->checked = 1;
    if (bits_obj != Py_None) {
        if (PyObject_GetBuffer(bits_obj, &p->bits, PyBUF_WRITABLE) < 0) goto fail;
        p->has_bits = 1;
    }
    if (checked_args(&p->src, rb, &p->rows, &p->ids, &p->aux, p->has_bits ? &p->bits : NULL,
                     &p->out, &n) < 0)
        goto fail;
    p->bad = (int64_t *)PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    /* one count for each piece: at most n of them, whatever the piece size comes to */
    p->sh.piece_bad = (Py_ssize_t *)PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    if (p->bad == NULL || p->sh.piece_bad == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    p->job = (Job){(uint8_t *)p->out.buf, (const uint8_t *)p->src.buf,
                   (const int64_t *)p->rows.buf, n, rb, (const int64_t *)p->ids.buf,
                   (const uint32_t *)p->aux.buf, p->has_bits ? (uint8_t *)p->bits.buf : NULL,
                   &p->added, &p->nbad, p->bad, &p->state, NULL};
    return queue_job(p);
fail:
    Py_DECREF(p);
    return NULL;
}

static PyMethodDef methods[] = {
    {"start", start, METH_VARARGS,
     "start(src, row_bytes, rows, out, limit) -> Pending: copies rows rows[j] of src to row j "
     "of out on the lane thread (limit < 0: every row of src is valid)."},
    {"start_checked", start_checked, METH_VARARGS,
     "start_checked(src, row_bytes, rows, ids, aux, bits, out) -> Pending: take_checked's copy "
     "and check on the lane thread; wait() returns its (new, bad)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_copylane", NULL, -1, methods};

PyMODINIT_FUNC PyInit__copylane(void) {
    if (PyType_Ready(&PendingType) < 0) return NULL;
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    pthread_atfork(NULL, NULL, after_fork_child);
    return m;
}
