"""The optimized program libtpu returns ("hlo_with_config": a serialized
HloModuleProtoWithConfig) as HLO text, through jaxlib's HLO bindings when
jaxlib is installed (an optional extra, like libtpu); without it the
serialized module is still saved, and the text says how to get it."""


def _fields(data):
    """(field number, bytes) of a protobuf message's length-delimited fields."""
    i, n = 0, len(data)

    def varint():
        nonlocal i
        v = shift = 0
        while True:
            c = data[i]
            i += 1
            v |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                return v
    while i < n:
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 2:
            size = varint()
            yield field, data[i:i + size]
            i += size
        elif wire == 0:
            varint()
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return


def hlo_module_proto(optimized, fmt):
    """The HloModuleProto bytes of libtpu's optimized program."""
    if fmt == "hlo_with_config":
        for field, value in _fields(optimized):
            if field == 1:  # HloModuleProtoWithConfig.hlo_module
                return value
        return None
    return optimized if fmt == "hlo" else None


def to_text(optimized, fmt):
    """The scheduled HLO as text, or None with jaxlib missing or on a format we cannot read."""
    proto = hlo_module_proto(optimized, fmt)
    if proto is None:
        return None
    try:
        from jaxlib import xla_client
    except ImportError:
        return None
    return xla_client.hlo.HloModule.from_serialized_hlo_module_proto(proto).to_string()
