fn main() -> std::process::ExitCode {
    spillway_dwtools::dwcli::main()
}
