//! Views: turn model structs into what people and scripts read.
//!
//! Not for: computing anything. A view never reads the trace; if a number
//! is missing, it belongs in the model.
//!
//! ```
//! # fn show(summary: &memgap_model::Summary) {
//! print!("{}", memgap_views::terminal::summary(summary));
//! println!("{}", memgap_views::json::to_string(summary));
//! # }
//! ```

pub mod blame;
pub mod compare;
pub mod export;
pub mod format;
pub mod ghc;
pub mod go;
pub mod html;
pub mod json;
pub mod ledger;
pub mod metrics;
pub mod node;
pub mod numa;
pub mod outside;
pub mod palette;
pub mod terminal;
pub mod tree;
pub mod verdict;
pub mod watch;
