"""The worker's collector settings (protocol.quiet_gc) on the CPU: after a
load the live heap is frozen and the youngest generation collects every
5,000 allocations; an unload collects the unloaded model even where a
reference cycle holds it and it was frozen, so its memory is free before
another load; the model left loaded stays.

  python3 gc_test.py RUNTIME_DIR MODEL_DIR

Prints "N passed, 0 failed" or raises. Run by TestQuietGC.
"""
import gc
import sys
import weakref

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

from mlxsworker import protocol  # noqa: E402
from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt.backend import TorchBackend  # noqa: E402

passed = 0


def check(ok, what):
    global passed
    if not ok:
        raise AssertionError(what)
    passed += 1


w = protocol.Worker(None, None, TorchBackend(Settings()), False)
for name in ("a", "b"):
    w.load({"model": name, "path": sys.argv[2], "opts": {"device": "cpu"}})
check(gc.get_freeze_count() > 0 and gc.get_threshold()[0] == 5000, "after a load: frozen %d, thresholds %r"
      % (gc.get_freeze_count(), gc.get_threshold()))
refs = {name: weakref.ref(w.models[name]) for name in ("a", "b")}
for name in ("a", "b"):  # a cycle through each model, as modules and closures make them, frozen with it
    w.models[name].cycle = [w.models[name]]
gc.freeze()
w.unload({"model": "a"})
check(refs["a"]() is None, "the unloaded model, frozen in a cycle, outlived its unload")
check(refs["b"]() is not None and "b" in w.models, "the model left loaded was lost")
check(gc.get_freeze_count() > 0, "after an unload the live heap is not frozen again")
print("%d passed, 0 failed" % passed)
