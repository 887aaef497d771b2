//! Who may talk to this brain: the CA that signs every certificate, and the registry of
//! workers, admins and join tokens, and the HTTP API's tokens and sessions. Knows nothing of tasks or sessions.

pub mod ca;
pub mod registry;
pub mod web;
