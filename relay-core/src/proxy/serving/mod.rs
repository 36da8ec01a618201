//! The client API: the inference routes ([`routes`]) and how an answer becomes a response
//! ([`response`]), the names they take ([`aliases`], [`claude_code`]), a conversation's affinity
//! key ([`conversation`]), upstream providers ([`upstream`]), the Responses store
//! ([`responses_api`], [`responses_store`], [`responses_shared`]), the completed event of a
//! passing stream ([`completed_event`]) and stream patching ([`stream_patch`]). It reaches
//! dispatch only through the hub.

pub mod aliases;
pub mod claude_code;
pub mod completed_event;
pub mod conversation;
pub mod response;
pub mod responses_api;
pub mod responses_shared;
pub mod responses_store;
pub mod routes;
pub mod stream_patch;
pub mod upstream;
