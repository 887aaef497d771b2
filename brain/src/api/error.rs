//! The one place internal errors become `tonic::Status`: the code says what kind of failure
//! it is (the caller's input, a precondition, the brain's store), the message what to do.

use tonic::Status;

use crate::fleet::hub;
use crate::trust::registry;

impl From<registry::Error> for Status {
    fn from(e: registry::Error) -> Self {
        use registry::Error as E;
        match e {
            E::TokenUnknown | E::TokenUsed | E::TokenExpired => {
                Status::permission_denied(e.to_string())
            }
            E::NoSuchWorker(_) | E::NoSuchAdmin(_) => Status::not_found(e.to_string()),
            E::Ambiguous(_) => Status::invalid_argument(e.to_string()),
            E::AdminExists(_) => Status::already_exists(e.to_string()),
            E::Full(_) => Status::resource_exhausted(e.to_string()),
            E::Open { .. } | E::Sled(_) | E::Store(_) | E::Decode { .. } => {
                tracing::error!(error = %e, "store error");
                Status::internal(format!("brain store error: {e}"))
            }
        }
    }
}

impl From<crate::engine::Error> for Status {
    fn from(e: crate::engine::Error) -> Self {
        use crate::engine::Error as E;
        match e {
            E::NoSuchTask(_) => Status::not_found(e.to_string()),
            E::Ended(_) | E::Refused { .. } | E::Unplaceable(_) | E::Import(_) | E::Delivery(_) => {
                Status::failed_precondition(e.to_string())
            }
            E::Invalid(_) => Status::invalid_argument(e.to_string()),
            E::Peer(_) => Status::unavailable(e.to_string()),
            E::Log(_) => {
                tracing::error!(error = %e, "task log error");
                Status::internal(e.to_string())
            }
        }
    }
}

impl From<crate::provision::Error> for Status {
    fn from(e: crate::provision::Error) -> Self {
        use crate::provision::Error as E;
        match e {
            E::UnknownProvider { .. } | E::Invalid(_) => Status::invalid_argument(e.to_string()),
            E::NoSuchMachine(_) => Status::not_found(e.to_string()),
            E::Quota(_) => Status::resource_exhausted(e.to_string()),
            E::AlreadyEnded { .. } => Status::failed_precondition(e.to_string()),
            E::Provider { .. } => Status::unavailable(e.to_string()),
            E::Timeout { .. } => Status::deadline_exceeded(e.to_string()),
            E::Registry(e) => e.into(),
            E::Sled(_) | E::Store(_) | E::Decode { .. } => {
                tracing::error!(error = %e, "machine store error");
                Status::internal(e.to_string())
            }
        }
    }
}

impl From<hub::Error> for Status {
    fn from(e: hub::Error) -> Self {
        match e {
            hub::Error::NotConnected(_) => Status::failed_precondition(e.to_string()),
            hub::Error::Lost(_) => Status::unavailable(e.to_string()),
            hub::Error::Timeout { .. } => Status::deadline_exceeded(e.to_string()),
            hub::Error::Malformed { .. } => Status::internal(e.to_string()),
        }
    }
}

impl From<crate::mirror::Error> for Status {
    fn from(e: crate::mirror::Error) -> Self {
        use crate::mirror::Error as E;
        match e {
            E::Corrupt(_) | E::BadHash(_) | E::BadManifest { .. } => {
                Status::invalid_argument(e.to_string())
            }
            E::NoManifest(_) | E::NoBlob(_) => Status::not_found(e.to_string()),
            E::Shared(ref p) if p.is_transient() => Status::unavailable(e.to_string()),
            E::Io { .. } | E::Store(_) | E::Shared(_) | E::Tree(_) => {
                Status::internal(e.to_string())
            }
        }
    }
}
