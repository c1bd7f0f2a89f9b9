// meshtest: the test workload of meshctl's suite (server and client), standard library only.
module meshctl.test/meshtest

go 1.24
