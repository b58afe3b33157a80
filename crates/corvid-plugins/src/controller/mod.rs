//! The plugins backed by corvid's controller: `corvid` (a port asked of the controller)
//! and `corvid-k8s` (the port the Kubernetes watcher made for the pod), with what they
//! share: the wait for a port to be ACTIVE, and the controller's credentials.

pub mod corvid;
pub mod corvid_k8s;
pub mod credentials;
pub mod wait;
