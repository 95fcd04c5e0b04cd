"""A save under an existing ``checkpoint_id`` writes in place: each rank opens its final ``__R_0.distcp`` with "wb",
truncating the file the acknowledged checkpoint's ``.metadata`` points into, and only ``.metadata`` itself is
staged and renamed, after every rank's data. A re-save killed part-way leaves the old metadata over truncated
files (the checkpoint no longer loads) or over a mix of old and new files (it loads a state no save wrote). When
the directory already holds a checkpoint, the data files of the re-save are now named after its ``save_id``
(``__R_<save_id>_0.distcp``): the old checkpoint's files stay untouched until the new ``.metadata``, which names the
new files, replaces the old one. Readers follow the file names recorded in the metadata, so the format is
unchanged; the replaced checkpoint's data files are left in the directory."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="torch-dcp-resave-new-data-files",
    kind="fix",
    framework="torch",
    version="2.13.0",
    summary="a re-save truncates the data files the existing .metadata points into; name its files after save_id",
    hunks=(
        Hunk("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.prepare_global_plan", "e6026772a1352081", (
            ("        new_plans = [\n"
             "            dataclasses.replace(plan, storage_data=_StoragePrefix(f\"__{i}_\"))\n",
             "        # A re-save must not overwrite the files the existing metadata points\n"
             "        # into before its own metadata replaces it.\n"
             "        save_tag = f\"{self.save_id}_\" if self._metadata_exists() else \"\"\n"
             "        new_plans = [\n"
             "            dataclasses.replace(plan, storage_data=_StoragePrefix(f\"__{i}_{save_tag}\"))\n"),)),
        Hunk("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.prepare_local_plan", "963701e845bce565", (
            ("        self.fs.mkdir(self.path)\n"
             "        if self._metadata_exists():\n",
             "        self.fs.mkdir(self.path)\n"
             "        save_tag = \"\"\n"
             "        if self._metadata_exists():\n"
             "            save_tag = f\"{self.save_id}_\"\n"),
            ("                plan, storage_data=_StoragePrefix(f\"__{self.rank}_\")\n",
             "                plan, storage_data=_StoragePrefix(f\"__{self.rank}_{save_tag}\")\n"),)),
    ),
    covers=("torch-dcp-resave-crash-truncates-acknowledged", "torch-dcp-resave-crash-mixes-versions"),
    # killed at the rename of its metadata, the re-save then meets the removal of the old metadata before it
    requires=("torch-dcp-metadata-atomic-replace",),
)
