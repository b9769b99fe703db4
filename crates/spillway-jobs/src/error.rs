//! Why a job script is refused: one message per wrong line, each naming its line.

use std::fmt;

/// One thing wrong with a script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptError {
    /// 1-based line of the directive; 0 for the script as a whole.
    pub line: usize,
    pub message: String,
}

impl ScriptError {
    /// Long values quoted in `message` are cut (`input::cut_values`): a script's
    /// 10 MB value must not come back whole in the message.
    pub fn at(line: usize, message: impl Into<String>) -> ScriptError {
        ScriptError {
            line,
            message: crate::input::cut_values(&message.into()),
        }
    }

    pub fn whole(message: impl Into<String>) -> ScriptError {
        ScriptError::at(0, message)
    }
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

/// Everything wrong with a script, in line order; never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptErrors(pub Vec<ScriptError>);

impl ScriptErrors {
    pub fn one(e: ScriptError) -> ScriptErrors {
        ScriptErrors(vec![e])
    }
}

impl fmt::Display for ScriptErrors {
    /// One error per line (Slurm shows the tool's whole output to the user).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ScriptErrors {}
