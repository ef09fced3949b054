#!/bin/sh
# PID 1 of an rdmalab host container. With arguments it runs them (podman run IMAGE CMD...);
# without, it keeps the container alive and does nothing else: the agent is not started here,
# the controller ships it (bindings/rdmalab/machines/deploy.py, to /var/tmp/rdmalab-agent) and starts it through
# execnet (`podman exec -i <container> /usr/bin/python3`), one per run.
# A bare `sleep infinity` as PID 1 would ignore SIGTERM (PID 1 gets no default handlers), so
# `podman stop` would wait its timeout and kill; this exits on TERM/INT at once.
mkdir -p /run/lock /var/tmp/rdmalab-agent
[ $# -gt 0 ] && exec "$@"
trap 'exit 0' TERM INT
sleep infinity &
wait
