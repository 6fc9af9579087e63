"""Simulated click logs with known truth: click kernels (``clicks``) and the UBI-traffic simulator on top."""
