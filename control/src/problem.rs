//! `Problem`: something in the cluster state or the config that could not be used. Sources,
//! translation and the policy compiler report them; the control loop collects them.

use std::fmt;

/// Something in the state that could not be translated (the object is skipped, or partly).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `Kind namespace/name` (or `config`).
    pub object: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}
