//! The PostgreSQL backend. Being written: every call answers that this build cannot use it
//! yet, so a run fails closed (exit status 125) and never starts the command.

use std::time::Duration;

use super::{Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::config::{BackendConfig, PostgresTarget};

/// A lock backend on PostgreSQL.
pub struct PostgresBackend {
    display: String,
}

impl PostgresBackend {
    /// A backend for `target`.
    pub fn new(_target: PostgresTarget, config: &BackendConfig, _waiting: bool) -> PostgresBackend {
        PostgresBackend {
            display: config.display.clone(),
        }
    }

    fn unsupported(&self) -> BackendError {
        BackendError::Refused(format!(
            "the PostgreSQL backend ({}) is not available in this build yet",
            self.display
        ))
    }
}

impl Backend for PostgresBackend {
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
