"""Test hooks behind the fs layer's seam (`fs.fault_hook`, `fs.sync_observer`): the fault plans
of SLM_FAULTS (faults.py: crashes, I/O errors, pauses, a trace) and the power-cut simulator
(powercut.py, disk_image.py). Nothing here runs unless SLM_FAULTS is set or a test installs a
plan; the store's own modules never import this package."""
