"""Fixes of bugs met assembling whole tensors from ranks' live pieces (``full_param`` and its assemblers). Each
module imports only harness.fixes.patch."""
