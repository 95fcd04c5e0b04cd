"""The reference checkpoint on disk: its index format, safetensors files read and written by hand with block
checksums, one strict JSON reader, the commit protocols, and durable, link-refusing file primitives. Imports the
layout model, dtypes and errors of ``reference``; the engine above imports it, never the other way."""
