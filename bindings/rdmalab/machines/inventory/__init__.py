"""The inventory: real machines listed in a TOML file (docs/inventory.md), read with tomllib.

    inv = load("lab.toml")          # InventoryError names the file, the line and the field
    text = dumps(hosts, switches)   # the TOML text from plain dicts shaped like the file

The rooms: schema (the records and the loader that checks every field), lines (the line of a
field, found in the text: tomllib keeps no positions), secret_rule (secret-named fields are
refused and their values never shown), writer (dumps), fleet (inventory_fleet: free, healthy
hosts of one fabric, locked for a run).
"""
from __future__ import annotations

from .schema import (DEFAULT_AGENT_DIR, DEFAULT_KNOWN_HOSTS, HostEntry, Inventory,
                     InventoryError, PowerCommands, SshTarget, SwitchEntry, load)
from .secret_rule import WITHHELD, is_secret_name
from .writer import dumps

__all__ = [
    "DEFAULT_AGENT_DIR", "DEFAULT_KNOWN_HOSTS", "HostEntry", "Inventory", "InventoryError",
    "PowerCommands", "SshTarget", "SwitchEntry", "WITHHELD", "dumps", "is_secret_name", "load",
]
