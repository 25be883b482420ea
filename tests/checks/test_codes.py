"""checks.codes: the hot-path aliases are the generated protocol members themselves, under their names."""

from __future__ import annotations

import checks.codes
from codec.protocol import ApiKey, ErrorCode


def test_every_alias_is_the_protocol_member_of_its_name() -> None:
    aliases = {name: value for name, value in vars(checks.codes).items() if name.isupper()}
    assert aliases, "no aliases found"
    for name, value in aliases.items():
        member = ApiKey.__members__.get(name, ErrorCode.__members__.get(name))
        assert member is not None, f"{name} is neither an ApiKey nor an ErrorCode member"
        assert value is member, f"{name} is {value!r}, not {member!r}"
