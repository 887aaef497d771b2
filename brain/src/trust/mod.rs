//! Who may talk to this brain: the CA that signs every certificate, and the registry of
//! workers, admins and join tokens, the HTTP API's tokens and sessions, the secrets tasks'
//! commands may use (sealed) and the egress CA that lets the brain put them into requests.
//! Knows nothing of tasks or sessions.

pub mod ca;
pub mod egress_ca;
pub mod registry;
pub mod secrets;
pub mod shared_ca;
pub mod web;
