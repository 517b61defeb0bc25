"""Stage logic of PanelForge as plain Python (no Dagster), usable in tests, Ray workers and notebooks.

Every process that imports it skips the garbage collector's last pass at exit. After the exit
handlers ran, CPython's finalization collects once more over every tracked object, which in a
process holding torch, transformers and Dagster's definitions is millions of them: 0.5 s of CPU
for ``import jobs.definitions``, 1.9 s once OpenCLIP and the VLM engine are loaded, spent by every
command-line call, launched training job, code server and test worker when it ends, to free memory
the OS takes back anyway. ``gc.freeze`` registered here runs after every exit handler registered
later (they run last in, first out), so those still run; objects still referenced are still freed
as the modules are cleared; only cycles still alive at exit are left to the OS, whose finalizers
Python never promises to run (multiprocessing's children, Dagster's run workers among them, skip
finalization altogether with ``os._exit``).
"""

import atexit as _atexit
import gc as _gc

_atexit.register(_gc.freeze)
