"""A sharding-IO resume of a BF16 job (``ShardingIO.load_state_dict_from_checkpoint_with_reshard``) rebuilds the
parameters from the master weights every rank gathers, but ``_recover_params_from_master_weights`` first asserts
that this rank's ``optimizer.state_dict()`` has a ``"master_weights"`` key, which exists only where the optimizer
holds a master weight: under sharding stage 1 a rank that owns no BF16 parameter has none, and the resume dies with
``AssertionError: dict_keys([])`` on that rank. A missing key now means this rank brings no master weights to the
gather, which is what its empty share is."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-sharding-io-recover-without-master-weights",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="sharding-IO resume asserts where a rank's optimizer holds no master weight; read it as none",
    hunks=(
        Hunk("paddleformers.trainer.utils.sharding_io", "ShardingIO._recover_params_from_master_weights",
             "99bcb3e9561f04f4", ((
                 '        assert "master_weights" in opt_state_dict, opt_state_dict.keys()\n'
                 '        master_weights = opt_state_dict["master_weights"]\n',
                 '        master_weights = opt_state_dict.get("master_weights", {})  # none owned on this rank\n',
             ),)),
    ),
    covers=("paddleformers-trainer-sharding-io-resume-rank-without-master-weights",),
)
