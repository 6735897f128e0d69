"""The store's own verbs: import, activate and switch, names and their logs, specs, upgrade,
fsck and gc."""
