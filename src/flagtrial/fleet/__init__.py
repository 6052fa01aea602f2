"""Fleets: an Ansible inventory's group of identical hosts. `inventory` reads it with
ansible-core's own inventory code, `hosts` opens a session per host and tells their status,
`promote` runs the waves through ansible-runner, `hoststep` is what each wave's play runs
on this machine for one host (journal, verify against the canary, roll back)."""
