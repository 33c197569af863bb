"""Structure-aware mutations of protobuf bytes, for fuzzing the compiled trace decoder
against protobuf's parser.

Byte-level mutations (testkit/support/otlp_strategies.py) mostly break the wire format at
once. These edit the message tree instead, so that the result is still a message protobuf
may well accept, only an unusual one: a field sent twice (and an earlier copy with
invalid UTF-8), a field renumbered, a field sent with another wire type (its payload
converted to fit), a tag, length or value varint padded to more bytes than it needs (up
to past protobuf's limits: 5 bytes for a tag or a length, 10 for a value), an AnyValue
nested deep in arrays and key-value lists, 16-byte fields given ids that collide under the
decoder's former hash, fields moved or deleted. Every choice comes from a
:class:`Choices`: hypothesis's data in the tests, the fuzzer's bytes in fuzz/.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

VARINT, FIXED64, LENGTH_DELIMITED, GROUP_START, GROUP_END, FIXED32 = 0, 1, 2, 3, 4, 5
_MASK64 = (1 << 64) - 1
_BAD_UTF8 = (b"\xff", b"\xc3\x28", b"ok\xed\xa0\x80", b"\xe2\x82")


class Choices(Protocol):
    def integer(self, low: int, high: int) -> int:
        """A number from ``low`` to ``high``, both included."""
        ...


class ByteChoices:
    """Choices read from a byte string (a fuzzer's input); zeros once it runs out."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def integer(self, low: int, high: int) -> int:
        span = high - low + 1
        value = 0
        for _ in range((span - 1).bit_length() // 8 + 1):
            byte = self._data[self._at] if self._at < len(self._data) else 0
            self._at += 1
            value = value << 8 | byte
        return low + value % span


@dataclass(frozen=True)
class Field:
    """One field as it is on the wire: the padding fields are the bytes its varints take
    beyond the fewest they need."""

    number: int
    wire_type: int
    payload: int | bytes  # a varint's value; the bytes of any other wire type
    tag_padding: int = 0
    length_padding: int = 0
    value_padding: int = 0


def varint(value: int, padding: int = 0) -> bytes:
    """``value`` (0 to 2**64 - 1) as a varint, ``padding`` bytes longer than it needs."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            break
    if padding:
        out[-1] |= 0x80
        out.extend(b"\x80" * (padding - 1))
        out.append(0)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int, int] | None:
    """(value, position after it, padding), or None where it is cut or over 10 bytes."""
    value = 0
    for i in range(10):
        if at + i >= len(data):
            return None
        byte = data[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            value &= _MASK64
            return value, at + i + 1, i + 1 - len(varint(value))
    return None


def parse(data: bytes) -> list[Field] | None:
    """The fields of a message, or None where ``data`` is not one this module can edit
    (cut, a group, an unknown wire type)."""
    fields: list[Field] = []
    at = 0
    while at < len(data):
        tag = _read_varint(data, at)
        if tag is None or tag[0] >> 3 == 0 or tag[0] > 0xFFFFFFFF:
            return None
        key, at, tag_padding = tag
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value = _read_varint(data, at)
            if value is None:
                return None
            fields.append(Field(number, wire_type, value[0], tag_padding,
                                value_padding=value[2]))
            at = value[1]
        elif wire_type in (FIXED64, FIXED32):
            size = 8 if wire_type == FIXED64 else 4
            if at + size > len(data):
                return None
            fields.append(Field(number, wire_type, data[at:at + size], tag_padding))
            at += size
        elif wire_type == LENGTH_DELIMITED:
            length = _read_varint(data, at)
            if length is None or length[1] + length[0] > len(data):
                return None
            size, at, length_padding = length
            fields.append(Field(number, wire_type, data[at:at + size], tag_padding,
                                length_padding=length_padding))
            at += size
        else:
            return None
    return fields


def encode(fields: Sequence[Field]) -> bytes:
    out = bytearray()
    for f in fields:
        out += varint(f.number << 3 | f.wire_type, f.tag_padding)
        if f.wire_type == VARINT:
            assert isinstance(f.payload, int)
            out += varint(f.payload, f.value_padding)
        elif f.wire_type == LENGTH_DELIMITED:
            assert isinstance(f.payload, bytes)
            out += varint(len(f.payload), f.length_padding) + f.payload
        elif f.wire_type == GROUP_START:  # the payload's fields, then the group's end
            assert isinstance(f.payload, bytes)
            out += f.payload + varint(f.number << 3 | GROUP_END)
        else:
            assert isinstance(f.payload, bytes)
            out += f.payload
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field's bytes."""
    return encode([Field(number, LENGTH_DELIMITED, payload)])


def _as_wire_type(f: Field, wire_type: int) -> Field:
    """``f`` sent with another wire type, its payload converted to one of that type."""
    raw = f.payload if isinstance(f.payload, bytes) else varint(f.payload)
    payload: int | bytes
    if wire_type == VARINT:
        payload = f.payload if isinstance(f.payload, int) else int.from_bytes(raw[:8], "little")
    elif wire_type == FIXED64:
        payload = raw[:8].ljust(8, b"\x00")
    elif wire_type == FIXED32:
        payload = raw[:4].ljust(4, b"\x00")
    else:  # length-delimited, or a group around the payload (a message's fields or not)
        payload = raw
    return Field(f.number, wire_type, payload)


def nested(value: bytes, depth: int, kinds: Sequence[int]) -> bytes:
    """AnyValue bytes wrapped ``depth`` times, each in an array (kind 0) or a key-value
    list (kind 1): AnyValue{array_value: {values: [inner]}} or
    AnyValue{kvlist_value: {values: [{key: "k", value: inner}]}}."""
    for level in range(depth):
        if kinds[level % len(kinds)] == 0:
            value = field(5, field(1, value))
        else:
            value = field(6, field(1, field(1, b"k") + field(2, value)))
    return value


def _mutate_here(fields: list[Field], at: int, choices: Choices,
                 colliding_ids: Sequence[bytes]) -> list[Field]:
    f = fields[at]
    op = choices.integer(0, 10)
    out = list(fields)
    if op == 0:  # duplicate: right after it, or at the end of the message
        out.insert(at + 1 if choices.integer(0, 1) else len(out), f)
    elif op == 1:  # renumber
        numbers = (f.number - 1, f.number + 1, choices.integer(1, 20), (1 << 29) - 1)
        number = numbers[choices.integer(0, len(numbers) - 1)]
        if number > 0:
            out[at] = replace(f, number=number)
    elif op == 2:  # another wire type
        wire_type = (VARINT, FIXED64, LENGTH_DELIMITED, FIXED32, GROUP_START)[
            choices.integer(0, 4)]
        if wire_type != f.wire_type:
            out[at] = _as_wire_type(f, wire_type)
    elif op == 3:  # a padded tag: 2 to 7 bytes in all (protobuf takes up to 5)
        tag_bytes = len(varint(f.number << 3 | f.wire_type))
        out[at] = replace(f, tag_padding=choices.integer(1, max(1, 7 - tag_bytes)))
    elif op == 4 and f.wire_type == LENGTH_DELIMITED:  # a padded length (up to 5)
        assert isinstance(f.payload, bytes)
        length_bytes = len(varint(len(f.payload)))
        out[at] = replace(f, length_padding=choices.integer(1, max(1, 10 - length_bytes)))
    elif op == 4 and f.wire_type == VARINT:  # a padded value (up to 10)
        assert isinstance(f.payload, int)
        value_bytes = len(varint(f.payload))
        out[at] = replace(f, value_padding=choices.integer(1, max(1, 11 - value_bytes)))
    elif op == 5 and f.wire_type == LENGTH_DELIMITED:  # an id of the colliding set
        out[at] = replace(f, payload=colliding_ids[choices.integer(0, len(colliding_ids) - 1)])
    elif op == 6 and f.wire_type == LENGTH_DELIMITED:  # an AnyValue nested deep
        assert isinstance(f.payload, bytes)
        kinds = [choices.integer(0, 1) for _ in range(3)]
        out[at] = replace(f, payload=nested(f.payload, choices.integer(1, 40), kinds))
    elif op == 7 and f.wire_type == LENGTH_DELIMITED:  # an earlier copy, not UTF-8
        bad = _BAD_UTF8[choices.integer(0, len(_BAD_UTF8) - 1)]
        out.insert(at, replace(f, payload=bad))
    elif op == 8:  # deleted
        del out[at]
    elif op == 9 and len(out) > 1:  # swapped with another field
        other = choices.integer(0, len(out) - 1)
        out[at], out[other] = out[other], out[at]
    elif op == 10:  # a field protobuf does not know, of any wire type
        wire_type = (VARINT, FIXED64, LENGTH_DELIMITED, FIXED32)[choices.integer(0, 3)]
        number = choices.integer(17, 40)
        extra = _as_wire_type(Field(number, LENGTH_DELIMITED, b"\x08\x01"), wire_type)
        out.insert(choices.integer(0, len(out)), extra)
    return out


def _mutate_in(fields: list[Field], choices: Choices, colliding_ids: Sequence[bytes],
               depth: int) -> list[Field]:
    if not fields:
        return [Field(choices.integer(1, 16), LENGTH_DELIMITED, b"")]
    at = choices.integer(0, len(fields) - 1)
    f = fields[at]
    if f.wire_type == LENGTH_DELIMITED and depth < 12 and choices.integer(0, 3):
        assert isinstance(f.payload, bytes)
        inner = parse(f.payload)
        if inner:  # descend into what parses as a message
            out = list(fields)
            out[at] = replace(f, payload=encode(
                _mutate_in(inner, choices, colliding_ids, depth + 1)))
            return out
    return _mutate_here(fields, at, choices, colliding_ids)


def mutate(data: bytes, choices: Choices, colliding_ids: Sequence[bytes]) -> bytes:
    """``data`` with one structure-aware edit somewhere in its message tree (``data``
    unchanged where it does not parse)."""
    fields = parse(data)
    if fields is None:
        return data
    return encode(_mutate_in(fields, choices, colliding_ids, 0))
