//! How an error message quotes a client's input: cut to a bound, and quoted as Rust's
//! `{:?}` quotes. Used by the API's errors (`api::error`), the database's messages
//! (`db`) and authentication (`auth`); it sits below all three so that none of them
//! depends on another for it.

/// The most characters of a client's input an error message quotes (`cut`).
pub const ECHO_MAX: usize = 100;

/// A client's input as an error message may quote it: at most `ECHO_MAX` characters,
/// then `…` when there was more. Every error that echoes a token, a name, a path or a
/// query value goes through this (or `quoted`): a 1 MB bad value must not come back whole.
pub fn cut(s: &str) -> String {
    cut_to(s, ECHO_MAX)
}

/// The most characters kept of a text a library made about the input (serde's, axum's
/// rejections): longer than `ECHO_MAX` to keep their explanation, which may quote input.
pub const LIBRARY_TEXT_MAX: usize = 300;

/// `s` cut to `max` characters, `…` marking a cut.
pub fn cut_to(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// `cut`, quoted as Rust's `{:?}` quotes (control characters escaped).
pub fn quoted(s: &str) -> String {
    match s.char_indices().nth(ECHO_MAX) {
        Some((at, _)) => format!("{:?}…", &s[..at]),
        None => format!("{s:?}"),
    }
}
