pub mod run;
pub mod summary;
