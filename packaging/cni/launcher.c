/* meshctl-cni in the frozen one-dir tree: start the tree's own Python as `python -I -S` would
 * (isolated, no site, no PYTHON* variables) and call the CNI plugin's thin client,
 * meshctl_plugins.cni_plugin.client.main(), which hands the request to the node agent.
 *
 * Why C: PyInstaller's bootloader spends ~60 ms before the first line of the script (unpacking
 * its archive's table, runtime hooks, its own importers); this spends only Python's own start.
 * Invariants: nothing but the tree is read (libpython from <tree>/_internal by the rpath,
 * modules from <tree>/_internal and its base_library.zip); any failure to start Python is still
 * the CNI spec's error JSON on stdout (code 199) and exit 1, so the runtime never gets silence.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CLIENT "meshctl_plugins.cni_plugin.client"
#define STR2(x) #x
#define STR(x) STR2(x)
/* PyInstaller puts extension modules in _internal/pythonX.Y/lib-dynload. */
#define PY_MAJOR_MINOR STR(PY_MAJOR_VERSION) "." STR(PY_MINOR_VERSION)

static int fail(const char *what) {
    /* What the client would print; the runtime reads stdout, a person reads stderr. */
    printf("{\"cniVersion\": \"1.1.0\", \"code\": 199, \"msg\": \"meshctl-cni cannot start its "
           "interpreter: %s\"}\n", what);
    fflush(stdout);
    fprintf(stderr, "Error: meshctl-cni cannot start its interpreter: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return fail("cannot read /proc/self/exe");
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL) return fail("no directory in /proc/self/exe");
    *slash = '\0'; /* exe is now the tree's root */

    /* The search path PyInstaller's bootloader gives the tree's own executable. */
    char internal[PATH_MAX], zip[PATH_MAX], dynload[PATH_MAX];
    if (snprintf(internal, sizeof internal, "%s/_internal", exe) >= (int)sizeof internal ||
        snprintf(zip, sizeof zip, "%s/base_library.zip", internal) >= (int)sizeof zip ||
        snprintf(dynload, sizeof dynload, "%s/python" PY_MAJOR_MINOR "/lib-dynload", internal) >= (int)sizeof dynload)
        return fail("tree path too long");

    PyConfig config;
    PyConfig_InitIsolatedConfig(&config); /* -I: no environment, no user site, no cwd on path */
    config.site_import = 0;               /* -S */
    config.write_bytecode = 0;            /* the tree is read-only and verified */
    config.install_signal_handlers = 1;   /* an interrupt is KeyboardInterrupt, answered */
    PyStatus status = PyConfig_SetBytesArgv(&config, argc, argv);
    if (!PyStatus_Exception(status)) status = PyConfig_SetBytesString(&config, &config.home, internal);
    if (!PyStatus_Exception(status)) {
        wchar_t *paths[3] = {
            Py_DecodeLocale(zip, NULL), Py_DecodeLocale(dynload, NULL),
            Py_DecodeLocale(internal, NULL),
        };
        if (paths[0] && paths[1] && paths[2]) {
            config.module_search_paths_set = 1;
            status = PyConfig_SetWideStringList(&config, &config.module_search_paths, 3, paths);
        } else {
            status = PyStatus_Error("cannot decode the tree's path");
        }
        for (int i = 0; i < 3; i++) PyMem_RawFree(paths[i]);
    }
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) return fail(status.err_msg ? status.err_msg : "init failed");

    int code = 1;
    PyObject *client = PyImport_ImportModule(CLIENT);
    PyObject *result = client ? PyObject_CallMethod(client, "main", NULL) : NULL;
    if (result == NULL) {
        PyErr_Print();
        code = fail("the thin client failed (see stderr)");
    } else {
        code = (int)PyLong_AsLong(result);
        Py_DECREF(result);
    }
    Py_XDECREF(client);
    if (Py_FinalizeEx() < 0 && code == 0) code = 120;
    return code;
}
