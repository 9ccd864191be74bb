"""One way a record goes to JSON and back: pydantic's ``TypeAdapter`` over the frozen dataclasses.

``dump`` gives what ``json.dumps`` writes (tuples as lists, enums as their values, paths as
strings, NaN and infinities kept as floats); ``load`` validates it back into the class
(lists into tuples, values into enums), dropping keys the class does not have, so a campaign
folder an older version wrote still loads. A record whose older shape needs more than
that (a renamed field) subclasses ``Record`` and says how in ``upgrade``; nested records
are upgraded too, wherever they sit.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, TypeVar

from pydantic import GetCoreSchemaHandler, TypeAdapter
from pydantic_core import core_schema

T = TypeVar("T")


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def dump(obj: Any) -> dict[str, Any]:
    """``obj`` (a dataclass record) as plain JSON data. A value JSON has no type for (a numpy
    integer in a trial's ``extra``) is written as its ``str``, as ``CampaignDir.write_json``
    and the ledger write what ``json`` cannot."""
    return _adapter(type(obj)).dump_python(obj, mode="json", fallback=str, warnings=False)


def load(cls: type[T], data: Mapping[str, Any]) -> T:
    """``data`` (as ``dump`` wrote it, or an older shape of it) as a ``cls``."""
    return _adapter(cls).validate_python(data)


class Record:
    """Base of a frozen dataclass record: ``to_json`` / ``from_json`` through ``dump`` / ``load``."""

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """``data`` in today's shape: a hook for fields an older version named otherwise."""
        return data

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(
            lambda data: cls.upgrade(data) if isinstance(data, Mapping) else data, handler(source))

    def to_json(self) -> dict[str, Any]:
        return dump(self)

    @classmethod
    def from_json(cls: type[T], data: Mapping[str, Any]) -> T:
        return load(cls, data)
