"""Zero-Cost Checkpointing's flex-checkpoint workers (``ZeroCostCheckpointWorkerFcBased``) each write their rank's
shard of every family (model, optimizer, master weights, EMA), and the worker on device 0 writes each family's
metadata, merged by the job beforehand, right after its own shard. Nothing orders it after the other ranks'
workers: the metadata can be on disk naming ``1_0.distcp`` before rank 1's worker has written it, and a power loss
or a crash then leaves a checkpoint whose metadata names a shard that is not there. The worker now keeps each
metadata until the end of its dump, waits until every shard it names is in place (``paddle.save``'s durable
replace makes a shard's name appear only once its data is on disk), fsyncs them and their directory, and only then
writes the metadata."""

from harness.fixes.patch import Fix, Hunk

MODULE = "paddleformers.trainer.utils.zero_cost_checkpoint"

FIX = Fix(
    id="paddleformers-zcc-metadata-after-peer-data",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="ZCC workers: a family's metadata is written before other ranks' shards; write it once they are there",
    hunks=(
        Hunk(MODULE, "ZeroCostCheckpointWorker.process_dump_task_impl", "4bad281efd4cfc29", (
            ("        os.makedirs(output_dir, exist_ok=True)\n",
             "        os.makedirs(output_dir, exist_ok=True)\n"
             "        self.metadata_after_data = []  # (metadata, path): written once the shards it names are there\n"),
            ("        self._dump_args_and_state(output_dir)\n",
             "        self._dump_args_and_state(output_dir)\n"
             "\n"
             "        # Step2.6: each family's metadata, once every shard it names (other ranks' too) is on disk\n"
             "        for metadata, metadata_path in self.metadata_after_data:\n"
             "            home = os.path.dirname(metadata_path)\n"
             "            deadline = time.time() + 120\n"
             "            for name in sorted(set(metadata.storage_metadata.values())):\n"
             "                shard = os.path.join(home, name)\n"
             "                while not os.path.exists(shard):\n"
             "                    if time.time() > deadline:\n"
             "                        raise TimeoutError(f\"{metadata_path}: shard {name} was never written\")\n"
             "                    time.sleep(0.01)\n"
             "                for path in (shard, home):\n"
             "                    fd = os.open(path, os.O_RDONLY)\n"
             "                    try:\n"
             "                        os.fsync(fd)\n"
             "                    finally:\n"
             "                        os.close(fd)\n"
             "            paddle.save(metadata, metadata_path)\n"
             "        self.metadata_after_data = []\n"),
        )),
        Hunk(MODULE, "ZeroCostCheckpointWorkerFcBased._save_model_state", "a5ca3524aa009c33", (
            ("                    paddle.save(self.model_ckpt_meta, self.model_states_meta_path)\n",
             "                    self.metadata_after_data.append("
             "(self.model_ckpt_meta, self.model_states_meta_path))\n"),
        )),
        Hunk(MODULE, "ZeroCostCheckpointWorkerFcBased._save_opt_state", "bcde65b1749fb3d6", (
            ("                paddle.save(self.opt_ckpt_meta, self.opt_state_meta_path)\n"
             "                paddle.save(self.master_weight_ckpt_meta, self.master_weight_meta_path)\n",
             "                self.metadata_after_data.append((self.opt_ckpt_meta, self.opt_state_meta_path))\n"
             "                self.metadata_after_data.append("
             "(self.master_weight_ckpt_meta, self.master_weight_meta_path))\n"),
        )),
        Hunk(MODULE, "ZeroCostCheckpointWorkerFcBased._save_ema_state", "4aae881341a9a57a", (
            ("                    paddle.save(ema_ckpt_meta, self.ema_meta_path)\n",
             "                    self.metadata_after_data.append((ema_ckpt_meta, self.ema_meta_path))\n"),
        )),
    ),
    covers=("paddleformers-zcc-metadata-before-peer-data",),
    requires=("paddle-save-durable-replace",),
)
