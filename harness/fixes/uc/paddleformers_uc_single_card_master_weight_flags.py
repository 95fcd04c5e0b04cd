"""A job saved on several cards with ``unified_checkpoint_config`` ``skip_save_model_weight`` writes its master
weights where the model weights would go (``model.safetensors.index.json``); with ``remove_master_weight`` it
writes none, and a resume takes each weight widened as its master. The multi-card loader asks
``update_master_weight_status`` where the masters are; the one-card loader, ``load_single_card_optimizer``, never
sees the flags: it looks for ``master_weights.safetensors.index.json`` ("Can't find a optimizer index") or, with no
masters, names a 16-bit parameter's moments without their master's prefix, which ``set_state_dict`` then misses
("… should in state dict"). Either way the job cannot resume on one card. The one-card loader now takes the job's
arguments and finds the masters as the multi-card loader does, widening a weight read as its master."""

from harness.fixes.patch import Fix, Hunk

_MW = 'returned_optim_state_dict["master_weights"][static_name]'
_CALL = "            optim_state_dict = load_single_card_optimizer(model, optimizer, resume_from_checkpoint"

FIX = Fix(
    id="paddleformers-uc-single-card-master-weight-flags",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="load_single_card_optimizer ignores skip_save_model_weight / remove_master_weight: no resume on one card",
    hunks=(
        Hunk("paddleformers.trainer.unified_checkpoint.load_save_single_card", "load_single_card_optimizer",
             "482d5b322efec7b2", (
                 ("def load_single_card_optimizer(model, optimizer, resume_from_checkpoint: str):\n",
                  "def load_single_card_optimizer(model, optimizer, resume_from_checkpoint: str, args=None):\n"),
                 ("    has_master_weights = True if sharded_metadata[\"master_weights\"] else False\n",
                  "    has_master_weights = True if sharded_metadata[\"master_weights\"] else False\n"
                  "    index_filename_mw = SAFE_MASTER_WEIGHTS_INDEX_NAME\n"
                  "    if args is not None:  # where the job's flags put the masters, as the multi-card loader asks\n"
                  "        from .utils import update_master_weight_status\n"
                  "\n"
                  "        has_master_weights, index_filename_mw = update_master_weight_status(\n"
                  "            args, optimizer, has_master_weights, safe_serialization=True\n"
                  "        )\n"),
                 ("            index_filename=os.path.join(resume_from_checkpoint, SAFE_MASTER_WEIGHTS_INDEX_NAME),\n",
                  "            index_filename=os.path.join(resume_from_checkpoint, index_filename_mw),\n"),
                 (f"            {_MW} = state_dict_optim_mw.pop(key)\n",
                  f"            {_MW} = state_dict_optim_mw.pop(key)\n"
                  f"            if {_MW}.dtype != paddle.float32:  # a weight read as its master\n"
                  f"                {_MW} = paddle.cast({_MW}, dtype=paddle.float32)\n"),
             )),
        Hunk("paddleformers.trainer.unified_checkpoint.unified_checkpoint",
             "UnifiedCheckpointHandler.load_unified_optimizer", "85f44df5e362c6aa", (
                 (f"{_CALL})\n", f"{_CALL}, args=self.args)\n"),
             )),
    ),
    covers=("paddleformers-uc-skip-model-weight-single-card", "paddleformers-uc-remove-master-weight-single-card"),
)
