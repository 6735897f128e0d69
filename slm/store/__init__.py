"""The content-addressed store. Knows bytes, names and pointers; nothing about models."""

from slm.store.store import StoreDir, find_store, init_store

__all__ = ["StoreDir", "find_store", "init_store"]
