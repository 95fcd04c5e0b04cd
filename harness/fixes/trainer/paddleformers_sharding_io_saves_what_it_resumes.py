"""A sharding-IO checkpoint (``save_checkpoint_format="sharding_io"``, sharding stage 1) never resumes with the
default arguments: ``Trainer._save`` writes the model's shards through ``save_pretrained(save_to_hf=...)``, and
``save_to_hf`` defaults to True, so they land as ``model.shardNN.safetensors``; the resume
(``ShardingIO._load_one_state_dict_from_checkpoint``) reads ``model_state.shardNN.pdparams`` only, with
``paddle.load``, and raises "Can't find a valid checkpoint". The sharding-IO save now writes the format its own
resume reads."""

from harness.fixes.patch import Fix, Hunk


def _paddle_shards(indent: int) -> tuple[str, str]:
    """The sharding-IO ``save_pretrained`` call (the model may be wrapped or not: two copies, two indents)."""
    pad = " " * indent
    head = (f"{pad}variant=weight_name_suffix,\n{pad}save_function=self._save_ckpt_func,\n"
            f"{pad}is_main_process=self.args.should_save,\n{pad}max_shard_size=\"1024GB\",\n")
    return (head + f"{pad}save_to_hf=self.args.save_to_hf,\n",
            head + f"{pad}save_to_hf=False,  # the sharding-IO resume reads paddle shards only\n")


FIX = Fix(
    id="paddleformers-sharding-io-saves-what-it-resumes",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="sharding-IO save writes safetensors shards (save_to_hf default) its resume cannot read; write pdparams",
    hunks=(
        Hunk("paddleformers.trainer.trainer", "Trainer._save", "c258c0163ddb024e",
             tuple(_paddle_shards(indent) for indent in (28, 24))),
    ),
    covers=("paddleformers-trainer-sharding-io-resume-finds-no-model",),
)
