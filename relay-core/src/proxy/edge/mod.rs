//! Where requests meet the node: the listener's HTTP server ([`serve`]), who may reach it from
//! where ([`guard`]), the answers any route may give ([`answers`]), control requests' bodies in
//! time and within bounds ([`control_body`]), and what a worker's or upstream's answer may carry
//! onto the relay's origin ([`passthrough`]). The edge imports none of the other folders.

pub mod answers;
pub mod control_body;
pub mod guard;
pub(crate) mod passthrough;
pub mod serve;
