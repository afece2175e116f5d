//! The etcd backend. Being written: every call answers that this build cannot use it
//! yet, so a run fails closed (exit status 125) and never starts the command.

use std::time::Duration;

use super::{Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::config::{BackendConfig, EtcdTarget};

/// A lock backend on etcd.
pub struct EtcdBackend {
    display: String,
}

impl EtcdBackend {
    /// A backend for `target`.
    pub fn new(_target: EtcdTarget, config: &BackendConfig, _waiting: bool) -> EtcdBackend {
        EtcdBackend {
            display: config.display.clone(),
        }
    }

    fn unsupported(&self) -> BackendError {
        BackendError::Refused(format!(
            "the etcd backend ({}) is not available in this build yet",
            self.display
        ))
    }
}

impl Backend for EtcdBackend {
    async fn acquire(&self, _name: &str, _req: &AcquireRequest) -> Result<Acquire, BackendError> {
        Err(self.unsupported())
    }
    async fn renew(&self, _name: &str, _token: &str, _ttl: Duration) -> Result<(), BackendError> {
        Err(self.unsupported())
    }
    async fn release(&self, _name: &str, _token: &str, _how: Release) -> Result<(), BackendError> {
        Err(self.unsupported())
    }
    async fn inspect(&self, _name: &str) -> Result<Option<Holder>, BackendError> {
        Err(self.unsupported())
    }
    async fn force_release(&self, _name: &str) -> Result<Option<Holder>, BackendError> {
        Err(self.unsupported())
    }
    async fn wait_for_release(
        &self,
        _name: &str,
        _busy: &Holder,
        _max: Duration,
    ) -> Result<(), BackendError> {
        Err(self.unsupported())
    }
    async fn stop_waiting(&self, _name: &str) -> Result<(), BackendError> {
        Ok(())
    }
}
