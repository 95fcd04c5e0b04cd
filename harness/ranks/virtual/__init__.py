"""The emulator behind virtual ranks: a world of ranks as threads of one process running Paddle unmodified, and
what gloo gives each rank. Imports nothing else of the harness (harness.sut builds its worlds from here).
"""
