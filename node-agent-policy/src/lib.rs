//! The eviction policy core (kubelet parity). Pure: no I/O, `now` is always an argument.
