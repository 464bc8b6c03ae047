# accel-container-runtime .rpm %post ($1: 1 install, 2 upgrade): register the runtime with
# the engines on this node (idempotent) and give docker's --gpus its hook name when free.
. /usr/share/accel-container-runtime/engines.sh
accel_link_hook /usr/bin
accel_configure_engines /usr/bin
exit 0
