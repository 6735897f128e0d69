"""The content-addressed store. Knows bytes, names and pointers; nothing about models."""

from slm.store.store import Store, find_store, init_store

__all__ = ["Store", "find_store", "init_store"]
