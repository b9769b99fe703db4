fn main() -> std::process::ExitCode {
    spillway_dwtools::dwstat::main()
}
