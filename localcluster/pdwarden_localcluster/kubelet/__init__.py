"""A process kubelet: runs the containers of pods bound to its Nodes as local processes."""
