//! HTTP helpers every handler shares, written once: conditional requests and the 304 they answer
//! ([`conditional`]), entity-tags ([`etag`]), HTTP-dates ([`date`]), the fields a proxy adds or
//! removes ([`fields`]), short fixed responses ([`small`]), and why an upstream exchange failed
//! ([`fetch`]).
//!
//! This module sits low in the graph: it imports only [`crate::body`], so the handlers (proxy,
//! static files, images, admin), delivery, the cache and the server's interim writer all use it
//! without importing one another.

pub mod conditional;
pub mod date;
pub mod etag;
pub mod fetch;
pub mod fields;
pub mod query;
pub mod small;

pub use fetch::FetchError;
pub use small::{json_response, page_response, text_response};
