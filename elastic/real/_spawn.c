/*
 * elastic.real._spawn: start a worker with its parent-death signal set, in one exec.
 *
 * spawn(path, argv, envp, fd_map, pgid=0, pdeathsig=9, parent_pid=0, setsid=False,
 *       cgroup_fd=-1) -> pid
 *
 * Between vfork() and execve() the child, without running any Python code and using
 * only system calls that are safe there:
 *   1. leaves the parent's signal handlers (resets every caught signal to SIG_DFL: a
 *      signal arriving now must not run the parent's handler in the shared memory),
 *      and puts SIGPIPE and SIGXFSZ back to SIG_DFL (Python ignores them, and ignored
 *      signals survive exec; subprocess restores them the same way);
 *   2. setsid() when asked, else setpgid(0, pgid) when pgid >= 0 (0: lead its own group);
 *   2b. when cgroup_fd >= 0 (an open cgroup v2 ``cgroup.procs``), writes "0" to it: the
 *      child moves itself into that cgroup before it runs a line of its program, so
 *      everything it ever forks is born there (elastic.real.cgroup);
 *   3. dup2()s each (source, target) of fd_map in order (a source equal to its target
 *      loses close-on-exec instead, as posix_spawn's DUP2 does);
 *   4. prctl(PR_SET_PDEATHSIG, pdeathsig) when pdeathsig > 0: the kernel signals the
 *      child when the thread that started it dies, whatever the cause;
 *   5. checks getppid() == parent_pid when parent_pid > 0: if the parent died before
 *      step 4 the death signal would never come, so the child kills itself;
 *   6. restores the parent's signal mask and execve()s.
 * A failure in steps 2-6 is written (stage and errno) to memory the parent shares
 * during vfork; the child then _exit(127)s, the parent reaps it and raises OSError.
 * CGROUP_FD (module constant, 1): this build knows cgroup_fd (a stale build lacks it).
 * All arguments are converted to C arrays before vfork, so the child allocates nothing.
 * The calling thread is suspended until the child has exec'd or exited (vfork); other
 * threads of the parent keep running, which is safe for the same reasons as above.
 *
 * set_child_subreaper() -> None
 *   prctl(PR_SET_CHILD_SUBREAPER, 1) for the calling process; OSError on failure.  Here
 *   so that the agent need not import ctypes (≈3 ms of its start-up) to make one call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

enum stage { ST_NONE = 0, ST_SETSID, ST_SETPGID, ST_DUP2, ST_CLOEXEC, ST_PDEATHSIG,
             ST_PARENT_GONE, ST_EXEC, ST_CGROUP };

static const char *const stage_names[] = {
    "", "setsid", "setpgid", "dup2", "fcntl", "prctl(PR_SET_PDEATHSIG)", "getppid",
    "execve", "write(cgroup.procs)",
};

struct child_args {
    const char *path;
    char *const *argv;
    char *const *envp;
    const int *fd_map; /* pairs: source, target */
    Py_ssize_t n_fds;
    pid_t pgid;
    int pdeathsig;
    pid_t parent_pid;
    int setsid;
    int cgroup_fd;
    const sigset_t *old_mask;
    /* written by the child, read by the parent after vfork returns */
    volatile int err_stage;
    volatile int err_errno;
};

/* Runs in the vfork child: system calls only, never returns. */
static void __attribute__((noinline, noreturn)) child_exec(struct child_args *a)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction cur;
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        if (sigaction(sig, NULL, &cur) != 0)
            continue; /* not a valid signal number (glibc's reserved ones) */
        if (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN)
            sigaction(sig, &dfl, NULL);
    }
    sigaction(SIGPIPE, &dfl, NULL);
    sigaction(SIGXFSZ, &dfl, NULL);

    int stage = ST_NONE;
    if (a->setsid) {
        if (setsid() < 0) { stage = ST_SETSID; goto fail; }
    } else if (a->pgid >= 0) {
        if (setpgid(0, a->pgid) < 0) { stage = ST_SETPGID; goto fail; }
    }
    if (a->cgroup_fd >= 0) {
        /* "0": the writer itself; before dup2, which may overwrite the descriptor */
        if (write(a->cgroup_fd, "0", 1) != 1) { stage = ST_CGROUP; goto fail; }
    }
    for (Py_ssize_t i = 0; i < a->n_fds; i++) {
        int src = a->fd_map[2 * i], dst = a->fd_map[2 * i + 1];
        if (src == dst) {
            int flags = fcntl(src, F_GETFD);
            if (flags < 0 || fcntl(src, F_SETFD, flags & ~FD_CLOEXEC) < 0) {
                stage = ST_CLOEXEC;
                goto fail;
            }
        } else if (dup2(src, dst) < 0) {
            stage = ST_DUP2;
            goto fail;
        }
    }
    if (a->pdeathsig > 0) {
        if (prctl(PR_SET_PDEATHSIG, (unsigned long)a->pdeathsig, 0, 0, 0) != 0) {
            stage = ST_PDEATHSIG;
            goto fail;
        }
        if (a->parent_pid > 0 && getppid() != a->parent_pid) {
            /* the parent died before the death signal was armed: act it out now */
            kill(getpid(), a->pdeathsig);
            stage = ST_PARENT_GONE;
            errno = ESRCH;
            goto fail;
        }
    }
    sigprocmask(SIG_SETMASK, a->old_mask, NULL);
    execve(a->path, a->argv, a->envp);
    stage = ST_EXEC;
fail:
    a->err_errno = errno;
    a->err_stage = stage;
    _exit(127);
}

/* A NULL-terminated array of the bytes objects in seq (borrowed pointers). */
static char **bytes_array(PyObject *seq, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    char **out = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s must hold bytes, not %.100s", what,
                         Py_TYPE(item)->tp_name);
            PyMem_Free(out);
            Py_DECREF(fast);
            return NULL;
        }
        out[i] = PyBytes_AS_STRING(item);
        if ((Py_ssize_t)strlen(out[i]) != PyBytes_GET_SIZE(item)) {
            PyErr_Format(PyExc_ValueError, "%s holds an embedded null byte", what);
            PyMem_Free(out);
            Py_DECREF(fast);
            return NULL;
        }
    }
    /* the items stay alive: the caller keeps seq (and so fast's items) referenced and
       holds the GIL until the child has exec'd */
    Py_DECREF(fast);
    return out;
}

static PyObject *spawn(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"path", "argv", "envp", "fd_map", "pgid", "pdeathsig",
                             "parent_pid", "setsid", "cgroup_fd", NULL};
    PyObject *path_obj, *argv_obj, *envp_obj, *fd_map_obj;
    int pgid = 0, pdeathsig = SIGKILL, parent_pid = 0, want_setsid = 0, cgroup_fd = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&OOO|iiipi:spawn", kwlist,
                                     PyUnicode_FSConverter, &path_obj, &argv_obj,
                                     &envp_obj, &fd_map_obj, &pgid, &pdeathsig,
                                     &parent_pid, &want_setsid, &cgroup_fd))
        return NULL;

    PyObject *result = NULL;
    char **argv = NULL, **envp = NULL;
    int *fd_map = NULL;
    PyObject *fds = NULL;

    if (!PySequence_Check(argv_obj) || PySequence_Size(argv_obj) < 1) {
        PyErr_SetString(PyExc_ValueError, "argv must be a non-empty sequence of bytes");
        goto done;
    }
    if ((argv = bytes_array(argv_obj, "argv")) == NULL)
        goto done;
    if ((envp = bytes_array(envp_obj, "envp")) == NULL)
        goto done;
    fds = PySequence_Fast(fd_map_obj, "fd_map must be a sequence of (source, target)");
    if (fds == NULL)
        goto done;
    Py_ssize_t n_fds = PySequence_Fast_GET_SIZE(fds);
    fd_map = PyMem_Calloc((size_t)(2 * n_fds + 1), sizeof(int));
    if (fd_map == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_fds; i++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fds, i), "ii;fd_map items are "
                              "(source, target) pairs", &fd_map[2 * i], &fd_map[2 * i + 1]))
            goto done;
        if (fd_map[2 * i] < 0 || fd_map[2 * i + 1] < 0) {
            PyErr_SetString(PyExc_ValueError, "fd_map holds a negative descriptor");
            goto done;
        }
    }

    sigset_t all, old;
    sigfillset(&all);
    struct child_args a = {
        .path = PyBytes_AS_STRING(path_obj),
        .argv = argv,
        .envp = envp,
        .fd_map = fd_map,
        .n_fds = n_fds,
        .pgid = (pid_t)pgid,
        .pdeathsig = pdeathsig,
        .parent_pid = (pid_t)parent_pid,
        .setsid = want_setsid,
        .cgroup_fd = cgroup_fd,
        .old_mask = &old,
        .err_stage = ST_NONE,
        .err_errno = 0,
    };
    /* no signal handler may run in the child while it shares our memory */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = vfork();
    if (pid == 0)
        child_exec(&a);
    int vfork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    if (pid < 0) {
        errno = vfork_errno;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (a.err_stage != ST_NONE) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        int stage = a.err_stage;
        errno = a.err_errno;
        if (stage == ST_EXEC) {
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj);
        } else {
            PyObject *msg = PyUnicode_FromFormat("%s failed in the child: %s",
                                                 stage_names[stage], strerror(errno));
            if (msg != NULL) {
                PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iO", errno, msg);
                if (exc != NULL) {
                    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                    Py_DECREF(exc);
                }
                Py_DECREF(msg);
            }
        }
        goto done;
    }
    result = PyLong_FromLong((long)pid);

done:
    PyMem_Free(argv);
    PyMem_Free(envp);
    PyMem_Free(fd_map);
    Py_XDECREF(fds);
    Py_DECREF(path_obj);
    return result;
}

static PyObject *set_child_subreaper(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    (void)self;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_child_subreaper", set_child_subreaper, METH_NOARGS,
     "set_child_subreaper() -> None\n\n"
     "Make the calling process a child subreaper (prctl PR_SET_CHILD_SUBREAPER);\n"
     "OSError if the kernel refuses."},
    {"spawn", (PyCFunction)(void (*)(void))spawn, METH_VARARGS | METH_KEYWORDS,
     "spawn(path, argv, envp, fd_map, pgid=0, pdeathsig=9, parent_pid=0, setsid=False,"
     " cgroup_fd=-1) -> pid\n\n"
     "Start path with argv (bytes) and envp (b'NAME=value' items), after dup2'ing each\n"
     "(source, target) of fd_map, joining process group pgid (0: its own; -1: ours)\n"
     "or a new session, joining the cgroup whose cgroup.procs cgroup_fd is open on,\n"
     "and setting the parent-death signal; OSError if it cannot be executed (the child\n"
     "is reaped)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "elastic.real._spawn",
    "Start a process with its parent-death signal set, between vfork and exec.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spawn(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "CGROUP_FD", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
