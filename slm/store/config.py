"""config.toml, the store's settings, read strictly.

    format = 1                         the store format (top level)
    require_signed = true              the signing policy (top level; slm.ops.ship.policy)
    trusted_keys = ["ed25519:<b64>"]   (top level)

    [defaults]
    lock_timeout_s = 30.0              how long a writer waits for the store lock
    memory_budget = "2G"               the default of --memory-budget

    [cache]
    prompt_bytes = "1G"                the on-disk prompt cache's budget, all entries together
                                       (slm.ops.infer.prefix_cache; 0 keeps none)
  [gc]
    reflog_expiry = "90d"              how long a name's old targets stay reachable through its
                                       reflog (s, m, h, d or w; a bare number is days; "now")
    active_log_keep = 100              entries of logs/active `slm gc` always keeps
    active_log_expiry = "90d"          the age past which older entries of logs/active go

Every key slm does not know, and every known key in the wrong place, is refused (InvalidInput,
exit 4) naming the key, the table it is in and where it belongs. Nothing is ignored: TOML puts
every `key = value` written after a `[defaults]` line into that table, so `require_signed = true`
appended to a fresh config.toml (which ends with `[defaults]`) lands in [defaults], and a reader
that ignored it there would run unsigned compositions while the operator believes the policy is
on. Each setting's own range (a lock timeout of 0 to a day, a parseable size, a well-formed key)
is checked by the code that uses it.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from slm.errors import IntegrityError, InvalidInput, NotFound
from slm.store import fs
from slm.store.lock import DEFAULT_TIMEOUT_S

FILE_NAME = "config.toml"
FORMAT_VERSION = 1
MAX_CONFIG_BYTES = 1 << 20
# What to do about a config.toml that cannot be read at all: fsck cannot rebuild it (the
# settings it held, such as the signing policy, are not recorded anywhere else).
REMEDY = ("remove it and run `slm init` to write a default config.toml, then add back the "
          "settings it held")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_key_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# key -> (check of its value, what the value must be), per table; "" is the top level
SCHEMA: dict[str, dict[str, tuple]] = {
    "": {
        "format": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        "require_signed": (lambda v: isinstance(v, bool), "true or false"),
        "trusted_keys": (_is_key_list, 'a list of "ed25519:<base64>" strings'),
    },
    "defaults": {
        "lock_timeout_s": (_is_number, "a number of seconds"),
        "memory_budget": (lambda v: isinstance(v, str) or _is_number(v), 'a size such as "512M" or "2G"'),
    },
    "cache": {
        "prompt_bytes": (lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)),
                         'a size such as "512M" or "1G", or a number of bytes'),
    },
    "gc": {
        "reflog_expiry": (lambda v: isinstance(v, str) or _is_number(v), 'a duration such as "90d" or "12h"'),
        "active_log_keep": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                            "a whole number of entries, 0 or more"),
        "active_log_expiry": (lambda v: isinstance(v, str) or _is_number(v), 'a duration such as "90d" or "12h"'),
    },
    "follow": {
        "interval": (lambda v: isinstance(v, str) or _is_number(v), 'a duration such as "5m" or "30s"'),
        "max_trial_deaths": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        "require_certificate": (lambda v: isinstance(v, bool), "true or false"),
    },
}
TABLES = tuple(t for t in SCHEMA if t)


def default_config() -> dict:
    return {"format": FORMAT_VERSION, "defaults": {"lock_timeout_s": DEFAULT_TIMEOUT_S}}


def _where(table: str) -> str:
    return f"the [{table}] table" if table else "the top level"


def _home(key: str) -> str | None:
    """The table a known key belongs in ("" for the top level), None for an unknown key."""
    return next((table for table, keys in SCHEMA.items() if key in keys), None)


def _belongs(key: str, table: str) -> str:
    home = _home(key)
    if home == "":
        return (f"config.toml: {key} is in the [{table}] table, but it belongs at the top level: "
                f"write it above the first [table] line (every key after a [{table}] line is "
                f"part of [{table}])")
    return f"config.toml: {key} is at the top level, but it belongs in the [{home}] table"


def check_config(doc: dict) -> None:
    """Refuse a key or table that is unknown or misplaced, and a value of the wrong kind."""
    for key, value in doc.items():
        if key in TABLES:
            if not isinstance(value, dict):
                raise InvalidInput(f"config.toml: {key} must be a table ([{key}]), not "
                                   f"{type(value).__name__}")
            _check_table(value, key)
        elif key in SCHEMA[""]:
            _check_value(key, value, "")
        elif _home(key) is not None:
            raise InvalidInput(_belongs(key, ""))
        elif isinstance(value, dict):
            raise InvalidInput(f"config.toml: unknown table [{key}] (the tables slm knows: "
                               f"{', '.join(f'[{t}]' for t in TABLES)})")
        else:
            raise InvalidInput(f"config.toml: unknown key {key!r} at the top level (known there: "
                               f"{', '.join(SCHEMA[''])})")


def _check_table(table: dict, name: str) -> None:
    for key, value in table.items():
        if key in SCHEMA[name]:
            _check_value(key, value, name)
        elif _home(key) is not None or key in TABLES:
            raise InvalidInput(_belongs(key, name) if key not in TABLES else
                               f"config.toml: [{name}.{key}]: [{key}] is a table of its own, "
                               f"not part of [{name}]")
        else:
            raise InvalidInput(f"config.toml: unknown key {key!r} in {_where(name)} (known there: "
                               f"{', '.join(SCHEMA[name])})")


def _check_value(key: str, value, table: str) -> None:
    accepts, kind = SCHEMA[table][key]
    if not accepts(value):
        name = f"{table}.{key}" if table else key
        raise InvalidInput(f"config.toml: {name} must be {kind}, not {value!r}")


def read_config(root: Path) -> dict:
    """The store's settings: valid TOML of a supported format (IntegrityError otherwise: the
    file is damaged) whose every key is known and in its place (InvalidInput otherwise)."""
    data = parse_config(root)
    check_format(data, root)
    check_config(data)
    return data


def parse_config(root: Path) -> dict:
    """config.toml as TOML, unchecked: IntegrityError if it is not a readable TOML file."""
    path = root / FILE_NAME
    raw = fs.read_store_file(path, MAX_CONFIG_BYTES, remedy=REMEDY)
    if raw is None:
        raise NotFound(f"{root} is not an slm store (no config.toml)")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise IntegrityError(f"{path} is not valid TOML ({err}): correct it, or {REMEDY}") from err


def check_format(data: dict, root: Path) -> None:
    """A store of another format is refused by every command, fsck included: repairing what
    it does not understand could destroy a newer slm's store."""
    version = data.get("format")
    if version != FORMAT_VERSION:
        raise IntegrityError(f"{root / FILE_NAME}: store format {version!r} is not supported "
                             f"(this slm reads format {FORMAT_VERSION})")


def lock_timeout(config: dict) -> float:
    """defaults.lock_timeout_s from config.toml: a finite number of seconds, 0 to a day."""
    defaults = config.get("defaults", {})
    value = defaults.get("lock_timeout_s", DEFAULT_TIMEOUT_S) if isinstance(defaults, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86400:
        raise InvalidInput(f"config.toml: defaults.lock_timeout_s must be a number of seconds "
                           f"from 0 to 86400, not {value!r}")
    return float(value)


DEFAULT_REFLOG_EXPIRY = "90d"
DEFAULT_ACTIVE_LOG_KEEP = 100
DEFAULT_ACTIVE_LOG_EXPIRY = "90d"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _gc_setting(config: dict, key: str, default):
    table = config.get("gc", {})
    return table.get(key, default) if isinstance(table, dict) else None


def reflog_expiry_s(config: dict) -> float:
    """gc.reflog_expiry from config.toml in seconds (default 90 days, as git's)."""
    return duration_s(_gc_setting(config, "reflog_expiry", DEFAULT_REFLOG_EXPIRY), "config.toml: gc.reflog_expiry")


def active_log_expiry_s(config: dict) -> float:
    """gc.active_log_expiry from config.toml in seconds (default 90 days)."""
    return duration_s(_gc_setting(config, "active_log_expiry", DEFAULT_ACTIVE_LOG_EXPIRY),
                      "config.toml: gc.active_log_expiry")


def active_log_keep(config: dict) -> int:
    """gc.active_log_keep from config.toml (default 100; its type checked by check_config)."""
    return int(_gc_setting(config, "active_log_keep", DEFAULT_ACTIVE_LOG_KEEP))


def duration_s(value, what: str, bare_unit: str = "d") -> float:
    """A duration of config.toml or the command line in seconds: "90d", "12h", "30m", "45s",
    "2w", a bare number (of `bare_unit`s), or "now" (0: nothing is kept for its age; a caller
    with a lower bound refuses it). InvalidInput naming `what` otherwise."""
    if value == "now":
        seconds = 0.0
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value) * _UNITS[bare_unit]
    elif isinstance(value, str) and value[-1:] in _UNITS and value[:-1].replace(".", "", 1).isdigit() \
            and value[:-1].isascii():
        seconds = float(value[:-1]) * _UNITS[value[-1]]
    elif isinstance(value, str) and value.replace(".", "", 1).isdigit() and value.isascii():
        seconds = float(value) * _UNITS[bare_unit]
    else:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise InvalidInput(f"{what} must be a duration such as \"90d\", \"12h\", \"30s\", a number of "
                           f"{_UNIT_NAMES[bare_unit]} or \"now\", not {str(value)[:40]!r}")
    return seconds


_UNIT_NAMES = {"s": "seconds", "d": "days"}
DEFAULT_FOLLOW = {"interval": "5m", "max_trial_deaths": 3, "require_certificate": False}
MAX_TRIAL_DEATHS = 100
MAX_INTERVAL_S = 7 * 86400


def follow_interval_s(value, what: str) -> float:
    """A follower's interval in seconds (a duration; a bare number is seconds), 1 s to a week."""
    seconds = duration_s(value, what, "s")
    if not 1 <= seconds <= MAX_INTERVAL_S:
        raise InvalidInput(f"{what} must be from 1 second to a week")
    return seconds


def follow_settings(config: dict) -> dict:
    """[follow] of config.toml: `interval` (between rounds, default 5 minutes, 1 s to a week),
    `max_trial_deaths` (follower deaths during one trial that roll it back, 1 to 100, default
    3) and `require_certificate` (a trial without a certificate of a trusted key fails: a
    registry that withholds certificates cannot skip the check; default false), each checked."""
    table = config.get("follow", {})
    table = table if isinstance(table, dict) else {}
    interval = follow_interval_s(table.get("interval", DEFAULT_FOLLOW["interval"]), "config.toml: follow.interval")
    deaths = table.get("max_trial_deaths", DEFAULT_FOLLOW["max_trial_deaths"])
    if type(deaths) is not int or not 1 <= deaths <= MAX_TRIAL_DEATHS:
        raise InvalidInput(f"config.toml: follow.max_trial_deaths must be an integer from 1 to {MAX_TRIAL_DEATHS}")
    required = table.get("require_certificate", DEFAULT_FOLLOW["require_certificate"])
    if not isinstance(required, bool):
        raise InvalidInput("config.toml: follow.require_certificate must be true or false")
    return {"interval_s": interval, "max_trial_deaths": deaths, "require_certificate": required}
