"""Helpers shared by the client's and the provider's tests."""


def find_key(value, key):
    """The first value of ``key`` anywhere in a JSON document."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for v in value:
            found = find_key(v, key)
            if found is not None:
                return found
    return None
