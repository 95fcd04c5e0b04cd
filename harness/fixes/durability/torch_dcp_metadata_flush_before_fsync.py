"""``FileSystemWriter.finish`` pickles the metadata into ``.metadata.tmp`` and calls ``os.fsync`` inside the ``with``
block, while the pickled bytes still sit in Python's file buffer: the fsync makes an empty file durable and the
bytes reach the kernel only at ``close``. After a power loss the renamed ``.metadata`` can come back empty and an
acknowledged checkpoint no longer loads (``Ran out of input``). The buffer is now flushed before the fsync, as
``_write_files_from_queue`` gets for free from ``torch.save``'s own flush of the data files."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="torch-dcp-metadata-flush-before-fsync",
    kind="fix",
    framework="torch",
    version="2.13.0",
    summary="FileSystemWriter.finish fsyncs .metadata.tmp before its pickled bytes leave the buffer; flush first",
    hunks=(Hunk("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.finish", "cc0038e467d7cd9d", (
        ("            if self.sync_files:\n"
         "                try:\n"
         "                    os.fsync(metadata_file.fileno())\n",
         "            if self.sync_files:\n"
         "                metadata_file.flush()\n"
         "                try:\n"
         "                    os.fsync(metadata_file.fileno())\n"),)),),
    covers=("torch-dcp-metadata-fsync-before-write",),
)
