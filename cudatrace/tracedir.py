"""The files of a trace directory besides the shim's traces (*.ctrace): one list for the
launcher that writes them and the reader that reads them (a leaf: imports nothing).

Samples (record/sampler.py): a full run appends every sample to samples.jsonl; an --aggregate
run keeps its files bounded (recent samples, the run's thinned history, the samples at each
figure's extreme). The reader merges whichever are there, by time, each sample once.
"""

RUN = "run.json"
DENIALS = "denials.jsonl"
SAMPLES = "samples.jsonl"
SAMPLES_PREV = "samples.prev.jsonl"
SAMPLES_HISTORY = "samples.history.jsonl"
SAMPLES_EXTREMES = "samples.extremes.jsonl"
SAMPLE_FILES = (SAMPLES_HISTORY, SAMPLES_EXTREMES, SAMPLES_PREV, SAMPLES)
# what the launcher read of the binaries for the shim's denial lines (record/hints.py)
HINTS = "hints.txt"
LAUNCHER_FILES = (RUN, DENIALS, HINTS, *SAMPLE_FILES)
# held (flock) by the launcher for the whole run: a second run into the directory is refused
LOCK = ".cudatrace.lock"

# ---- sealed chunks of a trace, compressed (record/seal.py writes, analyze/trace.py reads) ----
# <name>.ctrace.z beside the trace: entries appended back to back, each
#   magic b"CTZ1" | chunk index (u32) | compressed length (u32) | crc32 of the chunk (u32) | zlib
# The launcher appends an entry and fsyncs it BEFORE it punches the chunk out of the trace, so
# at any moment each chunk is whole in one of the two files; a reader takes an entry for a chunk
# whose bytes in the trace are zeros (punched), and ignores a torn last entry.
SEALED_SUFFIX = ".z"
SEALED_MAGIC = b"CTZ1"
SEALED_ENTRY = "<4sIII"  # magic, chunk, length, crc32 (struct format; 16 bytes)


def sealed_entries(blob: bytes):
    """(chunk index, raw bytes) of each whole, intact entry of a sidecar's contents, in order."""
    import struct
    import zlib

    off, size = 0, struct.calcsize(SEALED_ENTRY)
    while off + size <= len(blob):
        magic, chunk, length, crc = struct.unpack_from(SEALED_ENTRY, blob, off)
        if magic != SEALED_MAGIC or off + size + length > len(blob):
            return  # a torn last entry (or not ours): what follows cannot be trusted
        try:
            raw = zlib.decompress(blob[off + size : off + size + length])
        except zlib.error:
            return
        if zlib.crc32(raw) != crc:
            return
        yield chunk, raw
        off += size + length


def sealed_entry(chunk: int, raw: bytes, level: int = 1) -> bytes:
    """One sidecar entry for chunk `chunk` whose bytes are `raw`."""
    import struct
    import zlib

    z = zlib.compress(raw, level)
    return struct.pack(SEALED_ENTRY, SEALED_MAGIC, chunk, len(z), zlib.crc32(raw)) + z
