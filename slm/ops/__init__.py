"""The operations, one package per concern: slm.ops.store (the store's own verbs: import,
activate, names, fsck, gc), slm.ops.ship (bundles, registries, signatures, exports) and
slm.ops.infer (loading compositions to run, `slm run`, verify, the server's scheduler); their
typed results in slm.ops.results."""
