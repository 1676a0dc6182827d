pub mod blame;
pub mod export;
pub mod ledger;
pub mod map;
pub mod run;
pub mod snap;
pub mod summary;
pub mod timeline;
