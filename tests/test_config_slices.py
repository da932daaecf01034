"""config.py's slices hold no defaults of their own but the few tests lean on, and those
repeat Settings' (docs/ARCHITECTURE.md, convention 4): a default can never differ between
the daemon and a layer built from its slice."""

from __future__ import annotations

import msgspec

from frink_mlx import config
from frink_mlx.settings import Settings

# slice field -> the Settings field it is read from, where the names differ
RENAMED = {"fetch_urls": "fetch_image_urls"}
# slice defaults that differ on purpose, each with its reason
APART = {("HubConfig", "disk"): "None: no SSD tier in tests; Settings.disk_config() builds one"}


def test_every_slice_default_is_the_settings_default() -> None:
    settings = {f.name: f.default for f in msgspec.structs.fields(Settings)}
    differ = {}
    for name in dir(config):
        kind = getattr(config, name)
        if not (isinstance(kind, type) and issubclass(kind, config._Slice)) or kind is config._Slice:
            continue
        for field in msgspec.structs.fields(kind):
            if field.default is msgspec.NODEFAULT or (name, field.name) in APART:
                continue
            source = RENAMED.get(field.name, field.name)
            if settings.get(source, msgspec.NODEFAULT) != field.default:
                differ[f"{name}.{field.name}"] = (field.default, settings.get(source))
    assert differ == {}
