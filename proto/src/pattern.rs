//! Slurm's output file patterns (`-o slurm-%j.out`): expanded on the node
//! for the files a job writes, and by the CLI where `scontrol show job`
//! prints a job's `StdOut`.

/// Values an output file pattern can name.
#[derive(Debug)]
pub struct PatternVars<'a> {
    pub job: u64,
    pub name: &'a str,
    pub node: &'a str,
    pub user: &'a str,
    pub step: Option<u32>,
    /// Of a task of an array: the array's id and the task's index.
    pub array: Option<(u64, u32)>,
    /// A step's task (its rank) and node (its index among the step's
    /// nodes); the batch script is task 0 on node 0.
    pub task: Option<u32>,
    pub node_index: Option<u32>,
}

/// Whether a pattern names what differs between a step's tasks or nodes
/// (`%t`, `%n`, `%N`, with or without a width): a file each task or node
/// opens for itself. Any other names one file for the whole step.
pub fn names_task_or_node(pat: &str) -> bool {
    let mut chars = pat.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        let mut next = chars.next();
        while next.is_some_and(|d| d.is_ascii_digit()) {
            next = chars.next();
        }
        if matches!(next, Some('t' | 'n' | 'N')) {
            return true;
        }
    }
    false
}

/// Expands Slurm's filename pattern: `%j` job id, `%J` job.step, `%x` job
/// name, `%N` node, `%u` user, `%A` the array's id (outside an array, the
/// job's), `%a` the task's index in its array (4294967294, Slurm's value
/// outside one), `%s` step, `%t` task, `%n` node of the step, `%%`. A
/// number after `%` zero-pads (`%5j`).
pub fn expand_pattern(pat: &str, v: &PatternVars<'_>) -> String {
    let mut out = String::with_capacity(pat.len() + 16);
    let mut chars = pat.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut width = 0usize;
        while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
            width = (width * 10 + d as usize).min(64);
            chars.next();
        }
        let num = |n: u64| format!("{n:0width$}");
        match chars.next() {
            Some('%') => out.push('%'),
            Some('j') => out.push_str(&num(v.job)),
            Some('A') => out.push_str(&num(v.array.map_or(v.job, |a| a.0))),
            Some('J') => match v.step {
                Some(s) => out.push_str(&format!("{}.{s}", num(v.job))),
                None => out.push_str(&num(v.job)),
            },
            Some('a') => out.push_str(&num(v.array.map_or(4_294_967_294, |a| u64::from(a.1)))),
            Some('t') => out.push_str(&num(u64::from(v.task.unwrap_or(0)))),
            Some('n') => out.push_str(&num(u64::from(v.node_index.unwrap_or(0)))),
            Some('s') => out.push_str(&v.step.map_or("batch".to_string(), |s| num(s as u64))),
            Some('x') => out.push_str(v.name),
            Some('N') => out.push_str(v.node),
            Some('u') => out.push_str(v.user),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_naming_a_task_or_node_are_told_from_the_others() {
        for each in ["out-%t.txt", "%N.log", "r%3t", "%n", "a%%b-%t"] {
            assert!(names_task_or_node(each), "{each}");
        }
        for one in [
            "out.txt",
            "slurm-%j.out",
            "%J-%s-%x-%u",
            "100%%t",
            "x%",
            "%5j",
        ] {
            assert!(!names_task_or_node(one), "{one}");
        }
    }
}
